"""What ``import mcruntime`` leaves out, so that a process that does not need it never pays for it.

S1 counts the peer's CPU from process start, imports included: aiohttp's
server side comes with the first webhook or served endpoint, its client with
the first watch of a server without HTTP/2 or request through a proxy,
pydantic with ``ManagerSettings``, the distribution metadata with ``__version__``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import mcruntime
from mcruntime.testing import Fleet

DEFERRED = (
    "aiohttp",
    "aiohttp.web",
    "mcruntime._webhook.server",
    "pydantic",
    "mcruntime._client.wire",
    "hpack",
)


def test_import_mcruntime_leaves_the_server_side_and_settings_out() -> None:
    code = f"import sys, mcruntime; print(sorted(m for m in {DEFERRED!r} if m in sys.modules))"
    found = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert found.stdout.strip() == "[]", found.stdout


def test_the_version_is_read_when_asked_and_is_the_distribution_s() -> None:
    assert mcruntime.__version__ == version("mcruntime-core")
    assert "__version__" in mcruntime.__all__


def test_a_manager_still_builds_its_webhook_server_on_first_use() -> None:
    manager = mcruntime.Manager(mcruntime.StaticProvider({}), handle_signals=False)
    assert manager.webhook is manager.webhook
    assert type(manager.webhook).__name__ == "WebhookServer"


RUN_A_CLUSTER = """
import asyncio, json, sys
import mcruntime as mcr

async def main():
    config = mcr.kubeconfig_from_dict(json.loads(open(sys.argv[1]).read()))
    async with mcr.Cluster("lean", config) as cluster:
        kind = mcr.Kind("v1", "ConfigMap")
        name = "import-cost"
        await cluster.client.apply({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": name, "namespace": "default"}, "data": {"a": "1"}}, field_manager="t")
        informer = cluster.cache.informer(kind, namespace="default")
        assert await informer.wait_for_sync(30)
        await cluster.client.patch(kind, name, {"data": {"a": "2"}}, namespace="default")
        await cluster.client.delete(kind, name, namespace="default")
    print(sorted(m for m in sys.modules if m.split(".")[0] == "aiohttp"))

asyncio.run(main())
"""


def test_a_cluster_whose_server_speaks_http2_never_imports_aiohttp(fleet: Fleet, tmp_path: Path) -> None:
    """Requests go over our own connections and watches over HTTP/2: aiohttp's client is not needed."""
    kubeconfig = tmp_path / "kubeconfig.json"
    kubeconfig.write_text(json.dumps(fleet["cluster-1"].kubeconfig()))
    found = subprocess.run(
        [sys.executable, "-c", RUN_A_CLUSTER, str(kubeconfig)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert found.returncode == 0, found.stderr[-2000:]
    assert found.stdout.strip() == "[]", found.stdout
