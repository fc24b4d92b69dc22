"""The base a provider starts from: discovery is the provider's, everything else the ClusterSet's.

A provider that builds its clusters in a :class:`ClusterSet` answers the
``Provider`` protocol's questions (``get``, ``index_field``, ``statuses``)
the same way as every other; this base answers them once, so a provider's own
code is only its discovery and what it reports about its sources
(:meth:`ClusterSetProvider.sources`), which the base joins to the clusters.
"""

from __future__ import annotations

import dataclasses
import inspect
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager

from .._base.backoff import Backoff
from .._base.errors import KindNotFound, NotFound
from .._base.kind import Kind
from .._cache.informer import IndexFunc, Informer
from .._client.health import HealthState
from .._config.kubeconfig import ClusterConfig
from .cluster import Cluster, ClusterOptions
from .clusterset import ClusterSet
from .follow import KindNotInstalled, Watcher, follow_informers, wait_for_kind
from .protocols import Aware
from .status import ClusterPhase, ClusterStatus, SourceStatus, forbidden

Answer = tuple[Mapping[str, ClusterConfig], Mapping[str, SourceStatus]]
"""What a watching provider's pass decides: the clusters that should exist, and a source per thing read."""


class ClusterSetProvider:
    """A provider backed by a :class:`ClusterSet` (``self.clusters``); subclasses discover.

    Subclasses put what their source says into ``self.clusters`` (``sync``,
    ``set``, ``remove``) from their ``run``, and end it with
    ``await self.clusters.run(aware)``, which this base's ``run`` does alone.
    ``owner`` names the provider in logs and errors (``"kubeconfig files
    [...]"``); ``options`` are the clusters' options and ``probe_interval``
    overrides their health-probe interval; ``retry_backoff`` is how long
    :meth:`follow` waits after a failed pass (by default). Subclasses that read sources
    (files, Secrets, objects) override :meth:`sources`; :meth:`statuses` then
    carries each cluster's source, and lists as ``FAILED`` the clusters a
    source names whose config was never usable.

    A provider that watches a hub calls :meth:`follow` from its ``run``
    (and :meth:`wait_for_kind` first, if its CRD may be missing); the base
    then publishes its sources and reports the wait itself, so such a
    provider needs no ``sources`` of its own.
    """

    def __init__(
        self,
        owner: str,
        *,
        options: ClusterOptions | None = None,
        probe_interval: float | None = None,
        retry_backoff: Backoff | None = None,
    ) -> None:
        self._retry_backoff = retry_backoff
        self.clusters: ClusterSet = ClusterSet(options=options, probe_interval=probe_interval, owner=owner)
        self.owner = owner
        self._failed_since: dict[str, float] = {}
        self._published: dict[str, SourceStatus] = {}
        self._waiting: SourceStatus | None = None
        self._watched_hub: Cluster | None = None  # the hub being watched, while it is (see :meth:`watching`)
        self._followed: Sequence[Informer] = ()  # the hub's informers, while :meth:`follow` runs them

    @property
    def waiting(self) -> str | None:
        """Why discovery has not started (a CRD not installed yet, the hub not answering), else ``None``."""
        return self._waiting.error if self._waiting is not None else None

    async def wait_for_kind(
        self,
        hub: Cluster,
        candidates: Sequence[Kind],
        *,
        what: str,
        crd: str,
        backoff: Backoff | None = None,
        wait: bool = True,
        not_installed: type[KindNotInstalled] = KindNotInstalled,
    ) -> Kind:
        """:func:`wait_for_kind`, with the wait reported as :attr:`waiting` and as the source ``crd``.

        ``crd`` names the CustomResourceDefinition the operator should install
        (``"clusters.cluster.x-k8s.io"``); ``what`` names the product in messages.
        With ``wait=False`` a hub serving no candidate raises ``not_installed`` at once.
        """

        def report(problem: str | None) -> None:
            missing = SourceStatus("CustomResourceDefinition", crd, error=problem)
            self._waiting = None if problem is None else missing

        return await wait_for_kind(
            hub,
            candidates,
            owner=self.owner,
            what=what,
            report=report,
            backoff=backoff,
            wait=wait,
            not_installed=not_installed,
        )

    async def follow(
        self,
        aware: Aware,
        informers: Sequence[Informer],
        answer: Callable[[], Answer | Awaitable[Answer]],
        *,
        backoff: Backoff | None = None,
        watchers: Sequence[Watcher] = (),
    ) -> None:
        """Run ``informers`` and keep the clusters equal to ``answer()``'s until cancelled.

        ``answer()`` reads the informers' stores after each batch of events and
        returns the configs that should be engaged and a source per object
        read (it may be async, to parse off the event loop). Its sources are
        published, as :meth:`sources`, only once the ClusterSet has acted on
        the configs, so a status is never ahead of the clusters it describes.
        See :func:`follow_informers` for retries (``backoff``, by default the
        ``retry_backoff`` the provider was built with) and for
        ``watchers``, which ask for a pass when an input that is not an
        informer changes (a provider's own file).
        """
        pending: dict[str, SourceStatus] = {}

        async def desired() -> Mapping[str, ClusterConfig]:
            result = answer()
            configs, sources = await result if inspect.isawaitable(result) else result
            pending.clear()
            pending.update(sources)
            return configs

        def applied() -> None:
            self._published = dict(pending)

        self._followed = tuple(informers)
        try:
            await follow_informers(
                self.clusters,
                aware,
                informers,
                desired,
                owner=self.owner,
                applied=applied,
                backoff=self._retry_backoff if backoff is None else backoff,
                watchers=watchers,
            )
        finally:
            self._followed = ()

    async def get(self, name: str) -> Cluster:
        """The engaged cluster of this name; raises :class:`ClusterNotFound`."""
        return await self.clusters.get(name)

    async def index_field(self, kind: Kind, name: str, extract: IndexFunc) -> None:
        """Index ``kind`` by ``extract`` in every cluster, engaged now or later."""
        await self.clusters.index_field(kind, name, extract)

    def sources(self) -> Mapping[str, SourceStatus]:
        """What the provider made of each thing it read: the one place a broken source is reported.

        The base reports what :meth:`follow` last published and, while
        :meth:`wait_for_kind` waits, the missing CRD. A provider that discovers
        another way overrides it; include sources that name no cluster (an
        unreadable file, a failed listing) so nothing wrong goes unreported.
        Keyed by ``SourceStatus.name``.
        """
        found = dict(self._published)
        if self._waiting is not None:
            found[self._waiting.name] = self._waiting
        return found

    def statuses(self) -> Mapping[str, ClusterStatus]:
        """Frozen snapshots of every cluster's phase and source, by name; a copy kept never changes.

        An engaged cluster carries the source it runs on (else the first that
        claims its name). A name that only sources claim, none engaged, is
        ``FAILED`` with the source's error, since the first call that saw it so.
        """
        found = self.clusters.statuses()
        claims: dict[str, SourceStatus] = {}
        for source in self.sources().values():
            if source.cluster is not None:
                held = claims.get(source.cluster)
                if held is None or (source.engaged and not held.engaged):
                    claims[source.cluster] = source
        merged: dict[str, ClusterStatus] = {}
        now = time.time()
        for name in sorted({*found, *claims}):
            status = found.get(name)
            claim = claims.get(name)
            if status is not None:
                merged[name] = dataclasses.replace(status, source=claim)
                continue
            if claim is None or claim.error is None:  # named but waiting: not a cluster, not a failure
                continue
            since = self._failed_since.setdefault(name, now)
            merged[name] = ClusterStatus(
                name, ClusterPhase.FAILED, since, claim.error, engagements=0, source=claim
            )
        for name in list(self._failed_since):
            if name not in merged or merged[name].phase is not ClusterPhase.FAILED:
                del self._failed_since[name]
        trouble = self._hub_trouble(merged)
        if trouble is not None:
            merged[trouble.name] = trouble
        return merged

    @asynccontextmanager
    async def watching(
        self, connection: AbstractAsyncContextManager[Cluster], *, own: bool = True
    ) -> AsyncIterator[Cluster]:
        """Enter ``connection`` (the hub this provider reads) and report its trouble in :meth:`statuses`.

        A hub that refuses the provider (403, 401), does not answer, or lacks
        the provider's CRD would otherwise show in the log alone: nothing is
        engaged, so no cluster's line says anything. While that lasts,
        ``statuses()`` has a ``hub:OWNER`` entry (a name no Kubernetes object
        can have) saying why. It counts against ``/readyz`` only while no
        cluster of this provider is engaged, and never for a CRD that is merely
        not installed yet (the documented wait): members that still work keep
        a replica, and its webhooks, in service. With ``own=False`` (the
        caller's cluster, such as the manager's own, whose line in ``/readyz``
        speaks for it already) nothing is added.
        """
        async with connection as hub:
            self._watched_hub = hub if own else None
            try:
                yield hub
            finally:
                self._watched_hub = None

    def _hub_trouble(self, found: Mapping[str, ClusterStatus]) -> ClusterStatus | None:
        hub = self._watched_hub
        if hub is None:
            return None
        health = hub.health
        counts = True
        if health.missing_permissions:
            error = forbidden(health.missing_permissions)
        elif health.state is HealthState.UNHEALTHY:
            error = health.reason or "it does not answer"
        elif self.waiting is not None:
            error, counts = self.waiting, False
        elif (failing := self._failing_informer()) is not None:
            error, counts = failing
        else:
            return None
        if any(status.phase is not ClusterPhase.FAILED for status in found.values()):
            counts = False  # engaged members work on: shown, not counted
        name = f"hub:{self.owner}"
        phase = ClusterPhase.UNHEALTHY if counts else ClusterPhase.FAILED
        return ClusterStatus(
            name,
            phase,
            health.since,
            f"the hub cannot be read: {error}",
            engagements=0,
            source=SourceStatus("hub", hub.name, error=error),
            missing_permissions=health.missing_permissions,
        )

    def _failing_informer(self) -> tuple[str, bool] | None:
        """Why one of the hub's informers fails, and whether it counts (a kind no longer served does not)."""
        for informer in self._followed:
            failing = informer.failing
            if failing is None:
                continue
            gone = isinstance(failing, (KindNotFound, NotFound))
            what = "is no longer served" if gone else "fails to list or watch"
            return f"{informer.kind.kind} ({informer.kind.api_version}) {what}: {failing}", not gone
        return None

    async def run(self, aware: Aware) -> None:
        """Engage the clusters set so far, and later ones, with ``aware`` until cancelled."""
        await self.clusters.run(aware)
