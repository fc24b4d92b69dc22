"""Helpers shared by the examples' tests: clusters as kubeconfig files, and running an example.

The examples are programs, so their tests run them the way a user does, as a
task running the example's entry point against testbed control planes, and
watch what they do to the clusters or write to the log. Fleets are changed the
way a user changes them: by writing and deleting kubeconfig files.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import yaml

import mcruntime as mcr
from mcruntime.testing import ControlPlane, wait_until


class KubeconfigDir:
    """A directory of one admin kubeconfig per cluster, ``<name>.kubeconfig``, written atomically."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.mkdir(parents=True, exist_ok=True)

    def file(self, name: str) -> Path:
        """Where the kubeconfig of cluster ``name`` goes."""
        return self.path / f"{name}.kubeconfig"

    def add(self, plane: ControlPlane) -> Path:
        """Write the cluster's kubeconfig (context named after the cluster); returns the file."""
        return write_kubeconfig(self.file(plane.name), plane.kubeconfig())

    def remove(self, name: str) -> None:
        """Delete the kubeconfig of cluster ``name``: its cluster leaves the fleet."""
        self.file(name).unlink()


def write_kubeconfig(target: Path, kubeconfig: dict[str, Any]) -> Path:
    """Write a private (0600) kubeconfig by renaming a finished file over ``target``.

    A watcher never sees a half-written file, the way ``kubectl config`` writes.
    """
    temporary = target.with_name(f".{target.name}.partial")
    temporary.write_text(yaml.safe_dump(kubeconfig, sort_keys=False))
    temporary.chmod(0o600)
    os.replace(temporary, target)
    return target


@asynccontextmanager
async def running(
    program: Coroutine[Any, Any, object], name: str = "example"
) -> AsyncIterator[asyncio.Task[object]]:
    """Run an example's entry point as a task for the block, then cancel it.

    If the program ended by itself with an error, that error is raised here, so a
    test that timed out waiting says why the program died.
    """
    task: asyncio.Task[object] = asyncio.create_task(program, name=name)
    try:
        yield task
    finally:
        if task.done() and not task.cancelled():
            task.result()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def eventually(
    condition: Callable[[], object | Awaitable[object]], what: str, timeout: float = 45.0
) -> None:
    """Wait for ``condition`` with a deadline; the assertion message says what was awaited."""
    await wait_until(condition, timeout=timeout, what=what)


@asynccontextmanager
async def admin_cluster(plane: ControlPlane) -> AsyncIterator[mcr.Cluster]:
    """An mcruntime Cluster on the control plane's admin kubeconfig, for a test's own reads and writes."""
    async with mcr.Cluster(f"test:{plane.name}", mcr.kubeconfig_from_dict(plane.kubeconfig())) as cluster:
        yield cluster


async def create_namespace(cluster: mcr.Cluster, name: str) -> None:
    """Create a namespace unless it exists."""
    with contextlib.suppress(mcr.AlreadyExists):
        await cluster.client.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})


def merged_kubeconfig(contexts: dict[str, ControlPlane]) -> dict[str, Any]:
    """One kubeconfig with a context (and cluster and user of the same name) per ``name: plane``."""
    merged: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [],
        "users": [],
        "contexts": [],
    }
    for context, plane in contexts.items():
        single = plane.kubeconfig()
        merged["clusters"].append({"name": context, "cluster": single["clusters"][0]["cluster"]})
        merged["users"].append({"name": context, "user": single["users"][0]["user"]})
        merged["contexts"].append({"name": context, "context": {"cluster": context, "user": context}})
    merged["current-context"] = next(iter(contexts))
    return merged
