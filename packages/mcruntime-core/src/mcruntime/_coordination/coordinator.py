"""Coordinators decide which engaged clusters this replica *works* on.

Every replica engages every cluster its provider finds: caches stay warm and
sources keep delivering events everywhere. A coordinator only decides which
clusters' requests this replica's controllers accept, through the manager's
:class:`WorkGate`. Ownership changes therefore start and stop work, never
connections or caches, and gating by the *request's* cluster keeps
multi-cluster-aware controllers correct: a hub event mapped to a request for
member ``b`` is handled by whichever replica owns ``b``, because every replica
sees the hub event.

Without a coordinator the manager accepts every request (and with leader
election, workers run only on the leader). :class:`ShardedCoordinator` splits
the fleet between replicas.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from .._reconcile.context import current_request

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from .._control.controller import Controller
    from .._fleet.cluster import Cluster


class _Cut:
    """One cut's mark: a fresh object per cut, so a close can tell its own from a later one."""

    __slots__ = ("reason",)

    def __init__(self, reason: str) -> None:
        self.reason = reason


class WorkGate:
    """The set of clusters whose requests this replica's controllers accept.

    ``open`` admits clusters and replays what the caches already hold, since
    events that arrived while the gate was shut were dropped. ``close`` stops
    intake for a cluster, drops its queued requests and waits for its
    in-flight reconciles: after it returns, this replica does nothing more in
    that cluster, which is what makes handing it to another replica safe.
    ``cut`` is for work lost rather than handed over: it refuses the writes of
    reconciles still running there at once, before ``close`` ends them.
    """

    def __init__(self, controllers: Callable[[], Iterable[Controller]]) -> None:
        self._controllers = controllers
        self._open: set[str] = set()
        self._check: Callable[[], str | None] | None = None
        # Clusters cut and not yet closed (or opened again) → their mark: a close removes
        # only the mark it found (compared by identity), so a later cut keeps its own.
        self._cuts: dict[str, _Cut] = {}

    def guard(self, check: Callable[[], str | None] | None) -> None:
        """While ``check`` names a reason, no cluster is admitted and no reconcile may write.

        The coordinator's own account of whether its share is still good,
        asked at the moment of each decision: closing the clusters is the
        coordinator's task, and a task may run late, so neither a new
        reconcile nor a write of one already running waits for it.
        """
        self._check = check

    def refusal(self) -> str | None:
        """Why the reconcile in progress may not write now, or ``None``.

        The coordinator's check (see :meth:`guard`) holds for every cluster;
        a :meth:`cut` holds for the reconcile's own cluster, read from the
        reconcile's context (the transport asks this from inside it).
        """
        check = self._check
        reason = None if check is None else check()
        if reason is None and self._cuts and (request := current_request()) is not None:
            cut = self._cuts.get(request.cluster)
            if cut is not None:
                reason = f"cluster {request.cluster!r}: {cut.reason}"
        return reason

    def admits(self, cluster: str) -> bool:
        return cluster in self._open and (self._check is None or self._check() is None)

    @property
    def opened(self) -> frozenset[str]:
        return frozenset(self._open)

    def open(self, *clusters: str) -> None:
        """Admit ``clusters`` and enqueue what their sources' caches hold now."""
        fresh = set(clusters) - self._open
        if not fresh:
            return
        self._open |= fresh
        if self._cuts:
            for cluster in fresh:
                self._cuts.pop(cluster, None)
        for controller in self._controllers():
            controller.replay(fresh)

    def cut(self, clusters: Iterable[str], reason: str) -> None:
        """Shut ``clusters`` now and refuse every write their running reconciles still try.

        For work that another replica holds, or may hold, already (a fence
        taken or lost, a lapsed share). Closing is a task, and on a loop that
        runs late a reconcile ready at the same moment goes first: without the
        cut its write would race the new owner's. The caller then closes
        each cluster (:meth:`close`), which ends the reconciles and lifts the
        mark; :meth:`open` lifts it too.
        """
        for cluster in clusters:
            self._open.discard(cluster)
            self._cuts[cluster] = _Cut(reason)

    async def close(self, cluster: str, *, grace: float = 0.0) -> None:
        """Stop work in ``cluster``: in-flight reconciles get ``grace`` seconds, then are cancelled."""
        self._open.discard(cluster)
        cut = self._cuts.get(cluster)
        await asyncio.gather(*(controller.release(cluster, grace) for controller in self._controllers()))
        # Nothing runs there now and nothing is admitted: the mark has done its work.
        if cut is not None and self._cuts.get(cluster) is cut:
            del self._cuts[cluster]


class Seat(Protocol):
    """What a coordinator gets from the manager it coordinates."""

    @property
    def local(self) -> Cluster | None:
        """The hub: where coordination objects (Leases) live."""
        ...

    @property
    def work(self) -> WorkGate:
        """Open and close clusters for this replica's controllers."""
        ...

    def clusters(self) -> dict[str, Cluster]:
        """Every engaged cluster, the local one included as ``""``."""
        ...

    @property
    def engage_listeners(self) -> list[Callable[[str, Cluster], None]]: ...

    @property
    def disengage_listeners(self) -> list[Callable[[str, Cluster], None]]: ...

    @property
    def registry(self) -> CollectorRegistry:
        """The manager's metrics registry, for the coordinator's own metrics."""
        ...


@runtime_checkable
class Coordinator(Protocol):
    """Decides, for as long as :meth:`run` runs, which clusters this replica works on.

    The manager starts ``run`` once its local cluster is up and cancels it on
    shutdown, after its controllers have drained; ``run`` must then release
    whatever it holds. Until the coordinator opens a cluster, nothing in it
    is reconciled.

    A coordinator that runs loops of its own should also have a ``failing()``
    method returning one line per loop that died (see :class:`ReportsFailing`):
    the manager's ``/healthz`` then shows them, instead of passing while a
    loop is down and waiting to restart. One whose replica can be shut out
    by the hub (its Lease refused, its namespace missing) should also have a
    ``problem()`` method (see :class:`ReportsProblem`): ``/readyz`` then
    fails with it, instead of passing while this replica does nothing.
    """

    async def run(self, seat: Seat) -> None: ...


@runtime_checkable
class ReportsFailing(Protocol):
    """A coordinator whose own loops' deaths the manager's health shows."""

    def failing(self) -> list[str]:
        """One line per loop that died and is waiting to restart, naming it and why."""
        ...


@runtime_checkable
class ReportsProblem(Protocol):
    """A coordinator (or the leader elector) that can say why this replica cannot take part now."""

    def problem(self) -> str | None:
        """Why this replica cannot do its share now (which Lease, what the hub said), or ``None``.

        The manager's ``/readyz`` shows it as its ``coordination`` line: a
        replica that will never work, because the hub refuses it, must not pass.
        """
        ...
