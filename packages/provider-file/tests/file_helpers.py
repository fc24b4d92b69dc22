"""Helpers of the file provider's tests: writing kubeconfigs as real writers do, running the provider.

Shared by the test modules of this package (``pytest.ini`` puts this directory on the path).
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import os
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

import mcruntime as mcr
import mcruntime.provider as mcrp
from mcruntime.testing import ControlPlane, User, wait_until
from mcruntime.testing._harness import EngagementRecorder
from mcruntime.testing.conformance import CLUSTER_OPTIONS, PROBE_INTERVAL
from mcruntime_file import KubeconfigFileProvider


def provider_for(paths: Any, **kwargs: Any) -> KubeconfigFileProvider:
    kwargs.setdefault("options", CLUSTER_OPTIONS)
    kwargs.setdefault("probe_interval", PROBE_INTERVAL)
    kwargs.setdefault("debounce", 0.05)
    kwargs.setdefault("removal_delay", 0.1)
    return KubeconfigFileProvider(paths, **kwargs)


@asynccontextmanager
async def running(provider: KubeconfigFileProvider) -> AsyncIterator[EngagementRecorder]:
    """Run the provider for the block; afterwards every cluster it engaged must be stopped."""
    recorder = EngagementRecorder()
    task = asyncio.create_task(provider.run(recorder), name="test:file-provider")
    try:
        yield recorder
    finally:
        if task.done():
            task.result()  # the provider failed: say why
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    for name, history in recorder.engaged.items():
        for cluster in history:
            assert cluster.stopped and cluster.transport.closed, f"cluster {name!r} left running"


async def engaged(provider: KubeconfigFileProvider, name: str, server: str | None = None) -> mcr.Cluster:
    """Wait until ``name`` is engaged (pointing at ``server``, when given); return the cluster."""

    async def there() -> bool:
        try:
            cluster = await provider.get(name)
        except mcr.ClusterNotFound:
            return False
        return server is None or cluster.config.server == server

    await wait_until(there, what=f"cluster {name!r} registered" + (f" at {server}" if server else ""))
    return await provider.clusters.wait_engaged(name)  # handed to the aware, not only registered


async def gone(provider: KubeconfigFileProvider, name: str) -> None:
    await wait_until(lambda: name not in provider.clusters.names(), what=f"cluster {name!r} disengaged")


async def state(provider: KubeconfigFileProvider, name: str, wanted: mcr.ClusterPhase) -> mcr.ClusterStatus:
    def reached() -> bool:
        status = provider.statuses().get(name)
        return status is not None and status.phase is wanted

    await wait_until(reached, what=f"cluster {name!r} {wanted.value}")
    return provider.statuses()[name]


@dataclass(frozen=True)
class FileView:
    """One file's source and its contexts' sources, as ``provider.sources()`` reports them."""

    file: mcrp.SourceStatus
    contexts: dict[str, mcrp.SourceStatus]

    @property
    def error(self) -> str | None:
        return self.file.error

    @property
    def removing(self) -> tuple[str, ...]:
        listed = self.file.detail.get("removing")
        return tuple(listed.split(", ")) if listed else ()

    def errors(self) -> list[str]:
        return [s.error for s in (self.file, *self.contexts.values()) if s.error is not None]


def view(provider: KubeconfigFileProvider, path: Path) -> FileView:
    sources = provider.sources()
    contexts = {s.detail["context"]: s for s in sources.values() if s.detail.get("file") == str(path)}
    return FileView(sources[str(path)], contexts)


def errors(provider: KubeconfigFileProvider) -> list[str]:
    """Every current problem, file-level first, in input order."""
    return [source.error for source in provider.sources().values() if source.error is not None]


async def processed(provider: KubeconfigFileProvider, path: Path, content: bytes) -> FileView:
    """Wait until the provider's last pass read exactly ``content`` from ``path``."""
    digest = hashlib.sha256(content).hexdigest()

    def read() -> bool:
        status = provider.sources().get(str(path))
        return status is not None and status.version == digest

    await wait_until(read, what=f"{path} processed")
    return view(provider, path)


def kubeconfig(*entries: tuple[str, ControlPlane, User | None], current: str | None = None) -> dict[str, Any]:
    """A kubeconfig with one context per ``(context, plane, user)``; user None is the plane's admin."""
    document: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [],
        "users": [],
        "contexts": [],
    }
    for context, plane, user in entries:
        single = plane.kubeconfig(user)
        document["clusters"].append(
            {"name": f"{context}-cluster", "cluster": single["clusters"][0]["cluster"]}
        )
        document["users"].append({"name": f"{context}-user", "user": single["users"][0]["user"]})
        document["contexts"].append(
            {"name": context, "context": {"cluster": f"{context}-cluster", "user": f"{context}-user"}}
        )
    document["current-context"] = current or entries[0][0]
    return document


def dump(document: dict[str, Any]) -> bytes:
    return yaml.safe_dump(document).encode()


def write_atomic(path: Path, content: bytes) -> None:
    """Write the way careful writers do: a temporary file renamed over the target."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{uuid.uuid4().hex[:6]}")
    temporary.write_bytes(content)
    os.replace(temporary, path)


def write_in_place(path: Path, content: bytes) -> None:
    """Write the way editors and scripts often do: truncate, then write, same inode."""
    with path.open("r+b" if path.exists() else "wb") as handle:
        handle.truncate(0)
        handle.write(content)


async def uses_token(cluster: mcr.Cluster, token: str | None) -> bool:
    assert token is not None
    sent = await cluster.transport.authorization()
    return sent is not None and hmac.compare_digest(sent.encode(), f"Bearer {token}".encode())


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"
