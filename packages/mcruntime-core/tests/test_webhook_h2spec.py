"""h2spec, the HTTP/2 conformance suite, against the webhook server: every case must pass.

h2spec (github.com/summerwind/h2spec) sends each malformed or unusual
sequence of frames RFC 7540/9113 names and checks the server answers as the
RFC says: the right stream or connection error, the right code. It is built
from the Go module proxy on first use into the user's cache (a few seconds
when the modules are cached), under a lock so parallel workers build it once.
No cluster is involved: a server with nothing engaged answers every path 404,
which is all h2spec needs.
"""

from __future__ import annotations

import asyncio
import fcntl
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

import mcruntime as mcr
from mcruntime._webhook.server import WebhookServer

H2SPEC = "github.com/summerwind/h2spec/cmd/h2spec@v2.2.1+incompatible"
FAILED_MARK = "\u00d7"
"""What h2spec prints before a failed case (a multiplication sign)."""
CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "mcruntime-tests"


@pytest.fixture(scope="session")
def h2spec() -> Path:
    CACHE.mkdir(parents=True, exist_ok=True)
    binary = CACHE / "h2spec-v2.2.1"
    with open(CACHE / ".h2spec.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not binary.exists():
            go = shutil.which("go")
            assert go is not None, "h2spec is built with Go, and `go` is not on PATH"
            with tempfile.TemporaryDirectory(prefix="mcruntime-h2spec-") as scratch:
                environment = {**os.environ, "GOBIN": scratch, "GOFLAGS": "-mod=mod"}
                built = subprocess.run(
                    [go, "install", "-trimpath", H2SPEC],
                    env=environment,
                    capture_output=True,
                    text=True,
                    timeout=600,
                    check=False,
                )
                assert built.returncode == 0, f"go install {H2SPEC} failed:\n{built.stderr}"
                partial = binary.with_name(binary.name + ".partial")
                shutil.copy2(Path(scratch) / "h2spec", partial)
                partial.replace(binary)
        fcntl.flock(lock, fcntl.LOCK_UN)
    return binary


async def test_the_webhook_server_passes_every_h2spec_case(h2spec: Path, tmp_path: Path) -> None:
    server = WebhookServer(mcr.WebhookOptions(address="127.0.0.1:0"), clusters=dict)
    await server.listen()
    try:
        assert server.port is not None
        report = tmp_path / "h2spec.xml"
        process = await asyncio.create_subprocess_exec(
            str(h2spec),
            "-t",  # TLS, the only way the server listens
            "-k",  # our own CA: h2spec need not trust it
            "-h",
            "127.0.0.1",
            "-p",
            str(server.port),
            "-o",
            "5",  # seconds h2spec waits for each answer
            "-j",
            str(report),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        output, _ = await asyncio.wait_for(process.communicate(), timeout=300)
    finally:
        await server.close()
    text = output.decode(errors="replace")
    failed = [line.strip() for line in text.splitlines() if line.strip().startswith(FAILED_MARK)]
    assert process.returncode == 0 and not failed, text[-4000:]
    summary = [line for line in text.splitlines() if " tests, " in line]
    assert summary and summary[-1].endswith(" 0 failed"), summary
