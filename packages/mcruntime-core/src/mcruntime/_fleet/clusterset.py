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
- each cluster has a state: engaging, ready, or unhealthy with why, read from
  the cluster's own health record (its probe's verdict), so the set's
  statuses, ``/readyz`` and the metrics agree. Unhealthy is never treated as gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field

from .._base.errors import ClusterNotFound
from .._base.kind import Kind
from .._base.tasks import TaskSet
from .._cache.informer import IndexFunc
from .._client.health import ClusterHealth, HealthState
from .._config.kubeconfig import ClusterConfig
from .cluster import Cluster, ClusterOptions
from .protocols import Aware
from .status import ClusterPhase, ClusterStatus

log = logging.getLogger("mcruntime.clusterset")


@dataclass
class _Entry:
    cluster: Cluster
    fingerprint: str
    created: float
    engagements: int = 1
    credential_rotations: int = 0
    start_error: str | None = None
    engaged: asyncio.Event = field(default_factory=asyncio.Event)

    def status(self, name: str) -> ClusterStatus:
        health = self.cluster.health

        def status(phase: ClusterPhase, since: float, error: str | None) -> ClusterStatus:
            return ClusterStatus(
                name,
                phase,
                since,
                error,
                self.engagements,
                self.credential_rotations,
                missing_permissions=health.missing_permissions,
                refused_events=health.refused_events,
            )

        if health.state is HealthState.UNHEALTHY:
            return status(ClusterPhase.UNHEALTHY, health.since, health.reason)
        if not self.engaged.is_set() or health.state is HealthState.UNKNOWN:
            if self.start_error is not None:
                return status(ClusterPhase.UNHEALTHY, self.created, self.start_error)
            return status(ClusterPhase.ENGAGING, self.created, health.waiting)
        trouble = self.cluster.trouble()
        if trouble is not None:
            return status(ClusterPhase.UNHEALTHY, health.since, trouble)
        return status(ClusterPhase.READY, max(health.since, self.created), None)


class ClusterSet:
    """Named clusters built from configs, engaged with an :class:`Aware` while running."""

    def __init__(
        self,
        *,
        options: ClusterOptions | None = None,
        probe_interval: float | None = None,
        probe_timeout: float | None = None,
        owner: str = "clusters",
    ) -> None:
        """Clusters are built with ``options``; ``probe_interval``/``probe_timeout`` override its probe's."""
        options = options or ClusterOptions()
        if probe_interval is not None:
            options = dataclasses.replace(options, health_probe_interval=probe_interval)
        if probe_timeout is not None:
            options = dataclasses.replace(options, health_probe_timeout=probe_timeout)
        self.options = options
        self.options_for: Callable[[str], ClusterOptions] | None = None
        """A cluster's own options, by name, instead of :attr:`options` (read when it is built).

        For a fleet whose members differ: one member's cache scoped to the
        namespace its identity may read, a slower member's longer timeouts.
        """
        self._owner = owner
        self._entries: dict[str, _Entry] = {}
        self._locks: dict[str, _NameLock] = {}
        self._indexes: dict[tuple[Kind, str], IndexFunc] = {}
        self._aware: Aware | None = None
        self._tasks = TaskSet(owner)
        self._running = asyncio.Event()
        self._closed = False

    def __repr__(self) -> str:
        return f"<ClusterSet {self._owner} {sorted(self._entries)}>"

    # --- the provider's side ------------------------------------------------------------

    async def sync(self, desired: Mapping[str, ClusterConfig]) -> None:
        """Make the set equal ``desired``: add, replace and remove concurrently.

        Runs to the end even if the caller is cancelled halfway, and only then
        re-raises the cancellation: a replacement that started must finish, or
        its old cluster would leak.
        """
        if self._closed and desired:
            raise RuntimeError(f"{self._owner} is stopped")
        removals = [self.remove(name) for name in list(self._entries) if name not in desired]
        # A pass over 10,000 unchanged files must not cost 10,000 tasks: skip what is
        # already so (nobody is changing the name, and its fingerprint is the same).
        changes = [self.set(name, conf) for name, conf in desired.items() if not self._holds(name, conf)]
        applying = asyncio.gather(*removals, *changes)
        try:
            await asyncio.shield(applying)
        except asyncio.CancelledError:
            await asyncio.gather(applying, return_exceptions=True)
            raise

    def _holds(self, name: str, config: ClusterConfig) -> bool:
        current = self._entries.get(name)
        return current is not None and name not in self._locks and current.fingerprint == config.fingerprint()

    async def set(self, name: str, config: ClusterConfig) -> bool:
        """Add ``name``, or change it if its config changed; returns whether anything changed.

        Runs to the end even if the caller is cancelled halfway, so a cluster
        is never left registered but not started.
        """
        if self._closed:
            raise RuntimeError(f"{self._owner} is stopped")
        return await asyncio.shield(self._set(name, config))

    async def _set(self, name: str, config: ClusterConfig) -> bool:
        async with self._exclusive(name):
            if self._closed:
                return False
            fingerprint = config.fingerprint()
            current = self._entries.get(name)
            if current is not None and current.fingerprint == fingerprint:
                return False
            if current is not None and current.cluster.replace_credentials(config):
                current.fingerprint = fingerprint
                current.credential_rotations += 1
                log.info("%s: cluster %r: credentials rotated in place", self._owner, name)
                return True
            options = self.options_for(name) if self.options_for is not None else self.options
            cluster = Cluster(name, config, options)
            entry = _Entry(cluster, fingerprint, time.time())
            if current is not None:
                entry.engagements = current.engagements + 1
                entry.credential_rotations = current.credential_rotations
            self._entries[name] = entry  # the replacement is visible before the old one stops
            self._tasks.spawn(self._engage(name, entry), f"engage:{name}")
            if current is not None:
                log.info("%s: cluster %r changed; replacing it", self._owner, name)
                await current.cluster.stop()
            return True

    async def remove(self, name: str) -> bool:
        """Stop and forget ``name``; returns whether it existed."""
        async with self._exclusive(name):
            entry = self._entries.pop(name, None)
            if entry is None:
                return False
            log.info("%s: cluster %r removed", self._owner, name)
            await entry.cluster.stop()
            return True

    @contextlib.asynccontextmanager
    async def _exclusive(self, name: str) -> AsyncIterator[None]:
        """One change at a time per name; the lock goes when nobody holds or awaits it."""
        lock = self._locks.get(name)
        if lock is None:
            lock = self._locks[name] = _NameLock()
        lock.users += 1
        try:
            async with lock.lock:
                yield
        finally:
            lock.users -= 1
            if lock.users == 0 and self._locks.get(name) is lock:
                del self._locks[name]

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

    def __len__(self) -> int:
        """How many clusters the set holds (cheap: a provider checks it on every rescan)."""
        return len(self._entries)

    def status(self, name: str) -> ClusterStatus:
        """A snapshot of ``name``'s state; raises :class:`ClusterNotFound`."""
        entry = self._entries.get(name)
        if entry is None:
            raise ClusterNotFound(name)
        return entry.status(name)

    def health(self, name: str) -> ClusterHealth | None:
        """The health record of ``name``'s cluster, ``None`` if none is set.

        For providers that report a cluster's credential trouble with the
        source that names the credential (see ``ClusterHealth.credential_error``).
        """
        entry = self._entries.get(name)
        return entry.cluster.health if entry is not None else None

    def statuses(self) -> dict[str, ClusterStatus]:
        """A snapshot of every cluster's state, by name."""
        return {name: entry.status(name) for name, entry in sorted(self._entries.items())}

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
            # same, and its probe (like every request) tries to open it again.
            entry.start_error = f"start failed: {error}"
            log.warning("%s: cluster %r: %s", self._owner, name, entry.start_error)
        for (kind, index_name), extract in self._indexes.items():
            cluster.cache.index_field(kind, index_name, extract)
        await self._running.wait()
        if self._entries.get(name) is not entry or cluster.stopped:
            return  # replaced or removed while waiting
        assert self._aware is not None
        try:
            await self._aware.engage(name, cluster)
        except Exception:
            log.exception("%s: engaging cluster %r failed", self._owner, name)
        entry.engaged.set()


@dataclass
class _NameLock:
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    users: int = 0
