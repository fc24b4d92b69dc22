"""What the Lease loops' tests share: the Lease kind, fast timings, a seat without a manager, a hub to cut off."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

from prometheus_client import CollectorRegistry

import mcruntime as mcr
from mcruntime._coordination.coordinator import WorkGate
from mcruntime._coordination.heartbeat import own_connection

LEASE = mcr.Kind("coordination.k8s.io/v1", "Lease")
FAST: Any = {"lease_duration": 3.0, "renew_deadline": 2.0, "retry_period": 0.5}


def liveness_through(hub: mcr.Cluster, wrap: Callable[[mcr.Client], Any]) -> Any:
    """A coordinator's heartbeat connection (its own, opened on its thread), wrapped by ``wrap``."""

    @contextlib.asynccontextmanager
    async def connect() -> AsyncIterator[Any]:
        async with own_connection(hub.config, 5.0) as client:
            yield wrap(client)

    return connect


class Seat:
    """A coordinator's seat over a real hub, without a manager: clusters are just names."""

    def __init__(self, hub: Any, names: list[str], gate: WorkGate | None = None) -> None:
        self.local = hub
        self.work: Any = gate or WorkGate(list)
        self.names = set(names)
        self.engage_listeners: list[Any] = []
        self.disengage_listeners: list[Any] = []
        self.registry = CollectorRegistry()

    def clusters(self) -> dict[str, Any]:
        return dict.fromkeys(self.names, None)


@contextlib.asynccontextmanager
async def coordinating(coordinator: mcr.ShardedCoordinator, seat: Seat) -> AsyncIterator[asyncio.Task[None]]:
    task = asyncio.create_task(coordinator.run(seat))
    try:
        yield task
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


class Partition:
    """Whether the link to the hub is cut, for every client that goes through it."""

    cut = False


class Partitionable:
    """The real hub client, until the partition is cut: then every call fails as unreachable."""

    def __init__(self, real: mcr.Client, partition: Partition) -> None:
        self._real = real
        self._partition = partition

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._real, name)

        async def call(*args: Any, **kwargs: Any) -> Any:
            if self._partition.cut:
                raise mcr.Unreachable("connection refused (test partition)", cluster="hub")
            return await method(*args, **kwargs)

        return call
