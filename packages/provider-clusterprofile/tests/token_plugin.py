"""A tiny exec credential plugin for the tests: prints the credential kept in a file.

The file is named by ``--credential-file PATH`` (a profile adds it through the
KEP-5339 additional-args extension) or, failing that, by ``credentialFile`` in
the cluster's exec extension (``ExecCredential.spec.cluster.config``). It holds
JSON: ``{"token": ...}`` or ``{"clientCertificateData": ..., "clientKeyData": ...}``.
``PLUGIN_LOG``, when set, names a file that gets one line per run (tests count runs).
"""

from __future__ import annotations

import json
import os
import sys


def main(argv: list[str]) -> int:
    info = json.loads(os.environ.get("KUBERNETES_EXEC_INFO") or "{}")
    path = None
    if "--credential-file" in argv:
        path = argv[argv.index("--credential-file") + 1]
    else:
        cluster = (info.get("spec") or {}).get("cluster") or {}
        path = (cluster.get("config") or {}).get("credentialFile")
    if not path:
        print("no credential file given", file=sys.stderr)
        return 2
    with open(path, encoding="utf-8") as handle:
        status = json.load(handle)
    log = os.environ.get("PLUGIN_LOG")
    if log:
        with open(log, "a", encoding="utf-8") as handle:
            handle.write(json.dumps({"args": argv, "env": os.environ.get("PLUGIN_TENANT", "")}) + "\n")
    json.dump({"apiVersion": info.get("apiVersion"), "kind": "ExecCredential", "status": status}, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
