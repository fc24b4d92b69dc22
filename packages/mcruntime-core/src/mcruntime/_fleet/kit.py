"""The base a provider starts from: discovery is the provider's, everything else the ClusterSet's.

A provider that builds its clusters in a :class:`ClusterSet` answers the
``Provider`` protocol's questions (``get``, ``index_field``, ``statuses``)
the same way as every other; this base answers them once, so a provider's own
code is only its discovery and what it reports about its sources
(:meth:`ClusterSetProvider.sources`), which the base joins to the clusters.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping

from .._base.kind import Kind
from .._cache.informer import IndexFunc
from .cluster import Cluster, ClusterOptions
from .clusterset import ClusterSet
from .provider import Aware
from .status import ClusterPhase, ClusterStatus, SourceStatus


class ClusterSetProvider:
    """A provider backed by a :class:`ClusterSet` (``self.clusters``); subclasses discover.

    Subclasses put what their source says into ``self.clusters`` (``sync``,
    ``set``, ``remove``) from their ``run``, and end it with
    ``await self.clusters.run(aware)``, which this base's ``run`` does alone.
    ``owner`` names the provider in logs and errors (``"kubeconfig files
    [...]"``); ``options`` are the clusters' options and ``probe_interval``
    overrides their health-probe interval. Subclasses that read sources
    (files, Secrets, objects) override :meth:`sources`; :meth:`statuses` then
    carries each cluster's source, and lists as ``FAILED`` the clusters a
    source names whose config was never usable.
    """

    def __init__(
        self,
        owner: str,
        *,
        options: ClusterOptions | None = None,
        probe_interval: float | None = None,
    ) -> None:
        self.clusters: ClusterSet = ClusterSet(options=options, probe_interval=probe_interval, owner=owner)
        self._failed_since: dict[str, float] = {}

    async def get(self, name: str) -> Cluster:
        """The engaged cluster of this name; raises :class:`ClusterNotFound`."""
        return await self.clusters.get(name)

    async def index_field(self, kind: Kind, name: str, extract: IndexFunc) -> None:
        """Index ``kind`` by ``extract`` in every cluster, engaged now or later."""
        await self.clusters.index_field(kind, name, extract)

    def sources(self) -> Mapping[str, SourceStatus]:
        """What the provider made of each thing it read: the one place a broken source is reported.

        Override it in a provider that reads sources; the base reports none.
        Include sources that name no cluster (an unreadable file, a failed
        listing) so nothing wrong goes unreported. Keyed by ``SourceStatus.name``.
        """
        return {}

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
        return merged

    async def run(self, aware: Aware) -> None:
        """Engage the clusters set so far, and later ones, with ``aware`` until cancelled."""
        await self.clusters.run(aware)
