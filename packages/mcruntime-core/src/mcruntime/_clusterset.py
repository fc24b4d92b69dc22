"""ClusterSet: the one lifecycle engine every provider uses.

A provider says what should exist, ``await clusters.sync({name: config})`` or
``set``/``remove`` one at a time, and the set does the rest:

- a new name gets a new :class:`Cluster`, started and engaged in its own task,
  so a slow or broken cluster never blocks the others or the provider;
- an unchanged config (same fingerprint) does nothing; a changed token is
  swapped in place; any other change replaces the cluster (the new instance is
  registered before the old one stops, and an old instance can never remove
  its replacement, because entries are matched by instance, not by name);
- a removed name stops its cluster, which disengages it everywhere;
- field indexes registered at any time apply to every cluster, now and later;
- each cluster has a state: engaging, ready, or unhealthy with its last error,
  kept fresh by a periodic probe. Unhealthy is never treated as gone.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import random
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

from ._cluster import Cluster, ClusterOptions
from ._errors import ClusterNotFound
from ._informer import IndexFunc
from ._kind import Kind
from ._kubeconfig import ClusterConfig
from ._provider import Aware
from ._tasks import TaskSet

log = logging.getLogger("mcruntime.clusterset")


class ClusterState(enum.Enum):
    """Where a cluster is in its lifecycle."""

    ENGAGING = "engaging"
    READY = "ready"
    UNHEALTHY = "unhealthy"


@dataclass
class ClusterStatus:
    """A cluster's state, its last error and when it last changed."""

    name: str
    state: ClusterState
    since: float
    error: str | None = None
    engagements: int = 1
    credential_rotations: int = 0


@dataclass
class _Entry:
    cluster: Cluster
    fingerprint: str
    status: ClusterStatus
    engaged: asyncio.Event = field(default_factory=asyncio.Event)


class ClusterSet:
    """Named clusters built from configs, engaged with an :class:`Aware` while running."""

    def __init__(
        self,
        *,
        options: ClusterOptions | None = None,
        probe_interval: float = 10.0,
        probe_timeout: float = 5.0,
        owner: str = "clusters",
    ) -> None:
        self.options = options or ClusterOptions()
        self._probe_interval = probe_interval
        self._probe_timeout = probe_timeout
        self._owner = owner
        self._entries: dict[str, _Entry] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._indexes: dict[tuple[Kind, str], IndexFunc] = {}
        self._aware: Aware | None = None
        self._tasks = TaskSet(owner)
        self._running = asyncio.Event()
        self._closed = False

    def __repr__(self) -> str:
        return f"<ClusterSet {self._owner} {sorted(self._entries)}>"

    # --- the provider's side ------------------------------------------------------------

    async def sync(self, desired: Mapping[str, ClusterConfig]) -> None:
        """Make the set equal ``desired``: add, replace and remove concurrently."""
        removals = [self.remove(name) for name in list(self._entries) if name not in desired]
        changes = [self.set(name, config) for name, config in desired.items()]
        await asyncio.gather(*removals, *changes)

    async def set(self, name: str, config: ClusterConfig) -> bool:
        """Add ``name``, or change it if its config changed; returns whether anything changed."""
        if self._closed:
            raise RuntimeError(f"{self._owner} is stopped")
        async with self._lock(name):
            fingerprint = config.fingerprint()
            current = self._entries.get(name)
            if current is not None and current.fingerprint == fingerprint:
                return False
            if current is not None and current.cluster.replace_credentials(config):
                current.fingerprint = fingerprint
                current.status.credential_rotations += 1
                log.info("%s: cluster %r: credentials rotated in place", self._owner, name)
                return True
            cluster = Cluster(name, config, self.options)
            status = ClusterStatus(name, ClusterState.ENGAGING, time.time())
            if current is not None:
                status.engagements = current.status.engagements + 1
                status.credential_rotations = current.status.credential_rotations
            entry = _Entry(cluster, fingerprint, status)
            self._entries[name] = entry  # the replacement is visible before the old one stops
            if current is not None:
                log.info("%s: cluster %r changed; replacing it", self._owner, name)
                await current.cluster.stop()
            self._tasks.spawn(self._engage(name, entry), f"engage:{name}")
            return True

    async def remove(self, name: str) -> bool:
        """Stop and forget ``name``; returns whether it existed."""
        async with self._lock(name):
            entry = self._entries.pop(name, None)
            if entry is None:
                return False
            log.info("%s: cluster %r removed", self._owner, name)
            await entry.cluster.stop()
            return True

    def _lock(self, name: str) -> asyncio.Lock:
        return self._locks.setdefault(name, asyncio.Lock())

    # --- the consumers' side ---------------------------------------------------------------

    async def get(self, name: str) -> Cluster:
        """The current cluster of this name; raises :class:`ClusterNotFound`."""
        entry = self._entries.get(name)
        if entry is None:
            raise ClusterNotFound(name)
        return entry.cluster

    async def index_field(self, kind: Kind, name: str, extract: IndexFunc) -> None:
        """Record an index and apply it to every current cluster (and to later ones)."""
        self._indexes[(kind, name)] = extract
        for entry in self._entries.values():
            entry.cluster.cache.index_field(kind, name, extract)

    def names(self) -> list[str]:
        return sorted(self._entries)

    def status(self, name: str) -> ClusterStatus:
        entry = self._entries.get(name)
        if entry is None:
            raise ClusterNotFound(name)
        return entry.status

    def statuses(self) -> dict[str, ClusterStatus]:
        return {name: entry.status for name, entry in sorted(self._entries.items())}

    async def wait_engaged(self, name: str, timeout: float = 30.0) -> Cluster:
        """Wait until ``name`` has been handed to the aware (for tests and tools)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            entry = self._entries.get(name)
            if entry is not None:
                remaining = deadline - loop.time()
                try:
                    async with asyncio.timeout(max(remaining, 0)):
                        await entry.engaged.wait()
                except TimeoutError:
                    raise TimeoutError(f"cluster {name!r} was not engaged within {timeout}s") from None
                if self._entries.get(name) is entry:
                    return entry.cluster
            elif loop.time() >= deadline:
                raise TimeoutError(f"cluster {name!r} did not appear within {timeout}s")
            else:
                await asyncio.sleep(0.05)

    # --- running ---------------------------------------------------------------------------

    async def run(self, aware: Aware) -> None:
        """Engage every cluster, present and future, with ``aware`` until cancelled.

        Stops every cluster on the way out.
        """
        self._aware = aware
        self._running.set()
        try:
            await asyncio.Event().wait()
        finally:
            await self.close()

    async def close(self) -> None:
        """Stop every cluster and every background task."""
        self._closed = True
        entries = list(self._entries.values())
        self._entries.clear()
        await asyncio.gather(*(entry.cluster.stop() for entry in entries), return_exceptions=True)
        await self._tasks.close()

    async def _engage(self, name: str, entry: _Entry) -> None:
        cluster = entry.cluster
        try:
            await cluster.start()
        except Exception as error:
            if self._entries.get(name) is not entry or cluster.stopped:
                return  # replaced or removed while starting
            # Unusable TLS material, say: unhealthy, not gone. It is engaged all the
            # same, and the probe (like every request) tries to open it again.
            self._mark(entry, ClusterState.UNHEALTHY, f"start failed: {error}")
        for (kind, index_name), extract in self._indexes.items():
            cluster.cache.index_field(kind, index_name, extract)
        await self._running.wait()
        if self._entries.get(name) is not entry or cluster.stopped:
            return  # replaced or removed while waiting
        assert self._aware is not None
        try:
            await self._aware.engage(name, cluster)
        except Exception as error:
            self._mark(entry, ClusterState.UNHEALTHY, f"engage failed: {error}")
            log.exception("%s: engaging cluster %r failed", self._owner, name)
        entry.engaged.set()
        cluster.tasks.spawn(self._probe(entry), "health")

    async def _probe(self, entry: _Entry) -> None:
        """Keep the cluster's state honest: ready when it answers, unhealthy when not."""
        failures = 0
        while True:
            try:
                # asyncio.timeout, not wait_for: on 3.11 wait_for can swallow a
                # cancellation that races with completion, and this task must end.
                async with asyncio.timeout(self._probe_timeout):
                    status, _headers, _body = await entry.cluster.transport.request(
                        "GET", "/version", idempotent=True
                    )
                if status == 200:
                    self._mark(entry, ClusterState.READY, None)
                    failures = 0
                else:
                    self._mark(entry, ClusterState.UNHEALTHY, f"GET /version answered {status}")
                    failures += 1
            except Exception as error:  # unreachable, TLS, timeout: unhealthy, never gone
                self._mark(entry, ClusterState.UNHEALTHY, str(error) or type(error).__name__)
                failures += 1
            interval = self._probe_interval if failures == 0 else min(self._probe_interval, 0.5 * 2**failures)
            await asyncio.sleep(interval * random.uniform(0.8, 1.2))  # noqa: S311

    def _mark(self, entry: _Entry, state: ClusterState, error: str | None) -> None:
        if entry.status.state is not state:
            log.info(
                "%s: cluster %r is %s%s",
                self._owner,
                entry.status.name,
                state.value,
                f": {error}" if error else "",
            )
            entry.status.state = state
            entry.status.since = time.time()
        entry.status.error = error
