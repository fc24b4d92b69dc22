"""Helpers shared by the core's tests (plain functions, imported by name)."""

from __future__ import annotations

import contextlib
import os
import signal
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import aiohttp
from kubernetes_asyncio import client, config

import mcruntime as mcr
from mcruntime.testing import ControlPlane, User, admin_config, running, wait_until

# The harness lives in mcruntime.testing; these two names stay importable from here only
# until tests written on other branches against the old helpers are merged and ported
# (``wait_for(...)`` is ``wait_until(...)``). New tests import from mcruntime.testing.
wait_for = wait_until
__all__ = ["running", "wait_for"]

CONFIGMAP = mcr.Kind("v1", "ConfigMap")
NAMESPACE = mcr.Kind("v1", "Namespace")


@asynccontextmanager
async def core_api(kubeconfig: dict[str, Any]) -> AsyncIterator[client.CoreV1Api]:
    """A CoreV1Api on its own Configuration: no global client state is touched."""
    configuration = client.Configuration()
    await config.load_kube_config_from_dict(kubeconfig, client_configuration=configuration)
    async with client.ApiClient(configuration) as api_client:
        yield client.CoreV1Api(api_client)


def unique(prefix: str) -> str:
    """A name no other test uses, so tests never share objects through names."""
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


async def make_namespace(api: client.CoreV1Api, prefix: str = "test") -> str:
    name = unique(prefix)
    await api.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    return name


def configmap(name: str, namespace: str, **data: str) -> dict[str, Any]:
    """A ConfigMap manifest as JSON-shaped data."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": namespace},
        "data": dict(data),
    }


@asynccontextmanager
async def running_cluster(
    plane: ControlPlane, name: str | None = None, options: mcr.ClusterOptions | None = None
) -> AsyncIterator[mcr.Cluster]:
    """An mcruntime Cluster for a testbed control plane, stopped afterwards."""
    config = admin_config(plane, trust=mcr.TrustPolicy.untrusted())
    async with mcr.Cluster(name or plane.name, config, options) as cluster:
        yield cluster


async def configmap_reader(
    admin: mcr.Cluster, plane: ControlPlane, namespace: str, name: str = "reader"
) -> User:
    """A token user who may get, list and watch ConfigMaps in ``namespace`` only (a Role and its binding)."""
    rbac = "rbac.authorization.k8s.io"
    await admin.client.create(
        {
            "apiVersion": f"{rbac}/v1",
            "kind": "Role",
            "metadata": {"name": "read-configmaps", "namespace": namespace},
            "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list", "watch"]}],
        }
    )
    user = plane.add_token_user(name, cluster_admin=False, namespace=namespace)
    await admin.client.create(
        {
            "apiVersion": f"{rbac}/v1",
            "kind": "RoleBinding",
            "metadata": {"name": name, "namespace": namespace},
            "roleRef": {"apiGroup": rbac, "kind": "Role", "name": "read-configmaps"},
            "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": namespace}],
        }
    )
    return user


async def new_namespace(cluster: mcr.Cluster, prefix: str = "test") -> str:
    """Create a namespace of the test's own and return its name."""
    name = unique(prefix)
    await cluster.client.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    return name


async def create_again(cluster: mcr.Cluster, manifest: dict[str, Any]) -> None:
    """Create ``manifest`` once the object of its name deleted just before has finished going."""

    async def created() -> bool:
        with contextlib.suppress(mcr.AlreadyExists):
            await cluster.client.create(manifest)
            return True
        return False

    name = manifest["metadata"]["name"]
    await wait_until(created, what=f"{manifest['kind']} {name!r} created again")


def widget_crd(group: str) -> dict[str, Any]:
    """A namespaced CRD ``widgets.<group>`` (kind Widget, v1, with a status subresource)."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"widgets.{group}"},
        "spec": {
            "group": group,
            "scope": "Namespaced",
            "names": {"plural": "widgets", "singular": "widget", "kind": "Widget", "listKind": "WidgetList"},
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "x-kubernetes-preserve-unknown-fields": True,
                        }
                    },
                }
            ],
        },
    }


async def install_widget_crd(cluster: mcr.Cluster, group: str | None = None) -> mcr.Kind:
    """Install a namespaced CRD of a group of its own (or ``group``, with a status subresource)
    and wait until it is established; returns its Kind."""
    group = group or f"{unique('g')}.test.mcruntime.dev"
    crd = widget_crd(group)
    kind = mcr.Kind("apiextensions.k8s.io/v1", "CustomResourceDefinition")
    await cluster.client.create(crd)

    async def established() -> bool:
        current = await cluster.client.get(kind, f"widgets.{group}")
        conditions = (current.get("status") or {}).get("conditions") or []
        return any(c.get("type") == "Established" and c.get("status") == "True" for c in conditions)

    await wait_until(established, what=f"CRD widgets.{group} established")
    return mcr.Kind(f"{group}/v1", "Widget")


# --- credential shapes: tokens that cannot travel in a header, for every provider's tests ---

CREDENTIAL_SHAPES: dict[str, tuple[str, str]] = {
    # name: (how to spoil a token, what the refusal says)
    "trailing-newline": ("{token}\n", "the token ends with a line break"),
    "control-character": ("{head}\x07{tail}", "the token has a control character at character 9"),
    "non-ascii": ("{head}\u00e9{tail}", "the token has a non-ASCII character at character 9"),
}
"""Each shape of a hostile token, with the words a load-time refusal uses."""


def spoiled(token: str | None, shape: str) -> str:
    """``token`` in one of :data:`CREDENTIAL_SHAPES` (the character goes after the 8th)."""
    assert token is not None and len(token) > 8
    return CREDENTIAL_SHAPES[shape][0].format(token=token, head=token[:8], tail=token[8:])


def quotes_token(text: str, token: str | None) -> bool:
    """Whether ``text`` holds the token, or any 12 characters of it in a row."""
    assert token is not None
    return any(token[start : start + 12] in text for start in range(len(token) - 11))


def _own_tcp_sockets() -> Iterator[tuple[int, int, str]]:
    """This process's TCP sockets as (local port, remote port, state in hex), read from /proc."""
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:  # closed while we looked
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    for table in ("/proc/self/net/tcp", "/proc/self/net/tcp6"):
        with open(table) as lines:
            next(lines)
            for line in lines:
                fields = line.split()
                if fields[9] in inodes:
                    local, remote = (int(fields[i].rsplit(":", 1)[1], 16) for i in (1, 2))
                    yield local, remote, fields[3]


def connections_to(port: int) -> int:
    """This process's established TCP connections to ``port`` on loopback."""
    return sum(1 for _, remote, state in _own_tcp_sockets() if remote == port and state == "01")


def sockets_on(port: int) -> int:
    """This process's TCP sockets whose local port is ``port``: a server's listener and its side of each connection."""
    return sum(1 for local, _, _ in _own_tcp_sockets() if local == port)


@contextmanager
def hung(plane: ControlPlane) -> Iterator[None]:
    """The plane's kube-apiserver stopped (SIGSTOP, not killed) for the block: it hangs, it does not refuse.

    Continued (SIGCONT) afterwards, even when the block fails.
    """
    process = plane.apiserver.process
    assert process is not None and process.pid is not None
    stop(process.pid)
    try:
        yield
    finally:
        os.kill(process.pid, signal.SIGCONT)


def stop(pid: int, timeout: float = 10.0) -> None:
    """SIGSTOP ``pid`` and return once every one of its threads is stopped.

    ``kill`` returns when the signal is queued: a thread running on the other
    core may still answer a request that arrives in that instant (a client
    that writes it at once sees a "hung" server reply).
    """
    os.kill(pid, signal.SIGSTOP)
    tasks = Path(f"/proc/{pid}/task")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            states = [(task / "stat").read_text().rsplit(")", 1)[1].split()[0] for task in tasks.iterdir()]
        except (FileNotFoundError, ProcessLookupError):
            return  # gone, or not visible here (a container's process): nothing more to wait for
        if all(state in ("T", "t") for state in states):
            return
        time.sleep(0.001)  # polling the kernel's view of the threads: a few ms at most
    raise AssertionError(f"process {pid} did not stop within {timeout:g}s of SIGSTOP")


async def readyz(manager: mcr.Manager) -> tuple[int, str]:
    """The manager's ``/readyz?verbose``: its status and every check's line."""
    url = manager.endpoints.url("/readyz") + "?verbose"
    async with aiohttp.ClientSession() as session, session.get(url) as response:
        return response.status, await response.text()


FAKE_DISCOVERY: dict[str, object] = {
    "/version": {"major": "1", "minor": "36", "gitVersion": "v1.36.4"},
    "/api": {"kind": "APIVersions", "versions": ["v1"]},
    "/apis": {"kind": "APIGroupList", "groups": []},
    "/api/v1": {
        "kind": "APIResourceList",
        "groupVersion": "v1",
        "resources": [
            {
                "name": "configmaps",
                "kind": "ConfigMap",
                "namespaced": True,
                "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"],
            }
        ],
    },
}
"""What a fake API server answers to discovery: enough for a Cluster to engage and use ConfigMaps."""
