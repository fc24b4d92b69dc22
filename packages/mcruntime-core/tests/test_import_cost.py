"""What ``import mcruntime`` leaves out, so that a process that does not need it never pays for it.

S1 counts the peer's CPU from process start, imports included: aiohttp's
server side comes with the first webhook or served endpoint, its client with
the first watch of a server without HTTP/2 or request through a proxy,
pydantic with ``ManagerSettings``, the distribution metadata with ``__version__``.
The root's names themselves are imported when first used: sharding, RBAC and
the webhooks' handlers only by a program that touches them.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest

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


LAZY = (
    "mcruntime._coordination.sharding",
    "mcruntime._rbac.rbac",
    "mcruntime._webhook.handlers",
    "mcruntime._fleet.secret_provider",
    "mcruntime._manager.manager",
)


def test_import_mcruntime_imports_a_name_s_machinery_when_the_name_is_first_used() -> None:
    code = (
        "import sys, mcruntime\n"
        f"before = sorted(m for m in {LAZY!r} if m in sys.modules)\n"
        "from mcruntime import Manager\n"
        f"after = sorted(m for m in {LAZY!r} if m in sys.modules)\n"
        "print(before, after, 'Manager' in vars(mcruntime), 'Kind' in dir(mcruntime))"
    )
    found = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert found.stdout.split() == ["[]", "['mcruntime._manager.manager']", "True", "True"], found.stdout


def test_the_root_s_lazy_table_says_what_its_type_checking_imports_say() -> None:
    """Type checkers read the imports, the runtime reads the table: one may not drift from the other."""
    source = Path(mcruntime.__file__ or "").read_text()
    guarded = next(
        node
        for node in ast.parse(source).body
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"
    )
    imported = {
        (node.module or "", alias.name)
        for node in guarded.body
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
    }
    tabled = {(module, name) for module, names in mcruntime._EXPORTED_FROM.items() for name in names}
    assert imported == tabled
    assert {name for _module, name in tabled} | {"__version__"} == set(mcruntime.__all__)


def test_an_unknown_name_is_an_attribute_error_naming_it() -> None:
    with pytest.raises(AttributeError, match="has no attribute 'NoSuchThing'"):
        mcruntime.NoSuchThing  # type: ignore[attr-defined]  # noqa: B018


def test_the_version_is_read_when_asked_and_is_the_distribution_s() -> None:
    assert mcruntime.__version__ == version("mcruntime-core")
    assert "__version__" in mcruntime.__all__


PROVIDERS = {
    "mcruntime_file": "mcruntime-provider-file",
    "mcruntime_kind": "mcruntime-provider-kind",
    "mcruntime_capi": "mcruntime-provider-capi",
    "mcruntime_kubefed": "mcruntime-provider-kubefed",
    "mcruntime_namespace": "mcruntime-provider-namespace",
    "mcruntime_clusterprofile": "mcruntime-provider-clusterprofile",
}


def test_the_providers_read_no_metadata_at_import_and_their_version_when_asked() -> None:
    names = sorted(set(PROVIDERS) - {"mcruntime_kind"})  # kind's settings bring pydantic, which reads it
    code = f"import sys; import {', '.join(names)}; print('importlib.metadata' in sys.modules)"
    found = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert found.stdout.strip() == "False", found.stdout
    for module, distribution in PROVIDERS.items():
        imported = __import__(module)
        assert imported.__version__ == version(distribution), module
        assert "__version__" in imported.__all__, module


def test_a_manager_still_builds_its_webhook_server_on_first_use() -> None:
    manager = mcruntime.Manager(mcruntime.StaticProvider({}), handle_signals=False)
    assert manager.webhook is manager.webhook
    assert type(manager.webhook).__name__ == "WebhookServer"


RUN_A_MANAGER = """
import asyncio, json, sys
import mcruntime as mcr

async def main():
    config = mcr.kubeconfig_from_dict(json.loads(open(sys.argv[1]).read()))
    manager = mcr.Manager(mcr.StaticProvider({"lean": config}), handle_signals=False)
    kind = mcr.Kind("v1", "ConfigMap")
    name = "import-cost"
    seen = asyncio.Event()

    async def reconcile(request):
        cluster = await manager.get_cluster(request.cluster)
        found = await cluster.cache.get_or_none(kind, request.name, namespace=request.namespace)
        if request.name == name and found is not None and found["data"]["a"] == "2":
            seen.set()

    mcr.controller_managed_by(manager).named("lean").for_(kind, namespace="default").complete(reconcile)
    running = asyncio.create_task(manager.start())
    async with mcr.Cluster("writer", config) as writer:
        await writer.client.apply({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": name, "namespace": "default"}, "data": {"a": "1"}}, field_manager="t")
        await writer.client.patch(kind, name, {"data": {"a": "2"}}, namespace="default")
        await asyncio.wait_for(seen.wait(), 60)
        await writer.client.delete(kind, name, namespace="default")
    manager.stop()
    await running
    print(sorted(m for m in sys.modules if m.split(".")[0] == "aiohttp"))

asyncio.run(main())
"""


def test_a_manager_whose_servers_speak_http2_never_imports_aiohttp(fleet: Fleet, tmp_path: Path) -> None:
    """Requests go over our own connections, watches over HTTP/2, and nothing is served: no aiohttp."""
    kubeconfig = tmp_path / "kubeconfig.json"
    kubeconfig.write_text(json.dumps(fleet["cluster-1"].kubeconfig()))
    found = subprocess.run(
        [sys.executable, "-c", RUN_A_MANAGER, str(kubeconfig)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert found.returncode == 0, found.stderr[-2000:]
    assert found.stdout.strip() == "[]", found.stdout
