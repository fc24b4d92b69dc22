"""The base a provider starts from: discovery is the provider's, everything else the ClusterSet's.

A provider that builds its clusters in a :class:`ClusterSet` answers the
``Provider`` protocol's questions (``get``, ``index_field``, ``statuses``)
the same way as every other; this base answers them once, so a provider's own
code is only its discovery and what it reports about its sources.
"""

from __future__ import annotations

from collections.abc import Mapping

from .._base.kind import Kind
from .._cache.informer import IndexFunc
from .cluster import Cluster, ClusterOptions
from .clusterset import ClusterSet, ClusterStatus
from .provider import Aware


class ClusterSetProvider:
    """A provider backed by a :class:`ClusterSet` (``self.clusters``); subclasses discover.

    Subclasses put what their source says into ``self.clusters`` (``sync``,
    ``set``, ``remove``) from their ``run``, and end it with
    ``await self.clusters.run(aware)``, which this base's ``run`` does alone.
    ``owner`` names the provider in logs and errors (``"kubeconfig files
    [...]"``); ``options`` are the clusters' options and ``probe_interval``
    overrides their health-probe interval.
    """

    def __init__(
        self,
        owner: str,
        *,
        options: ClusterOptions | None = None,
        probe_interval: float | None = None,
    ) -> None:
        self.clusters: ClusterSet = ClusterSet(options=options, probe_interval=probe_interval, owner=owner)

    async def get(self, name: str) -> Cluster:
        """The engaged cluster of this name; raises :class:`ClusterNotFound`."""
        return await self.clusters.get(name)

    async def index_field(self, kind: Kind, name: str, extract: IndexFunc) -> None:
        """Index ``kind`` by ``extract`` in every cluster, engaged now or later."""
        await self.clusters.index_field(kind, name, extract)

    def statuses(self) -> Mapping[str, ClusterStatus]:
        """Frozen snapshots of every cluster's phase, by name; a copy kept never changes."""
        return self.clusters.statuses()

    async def run(self, aware: Aware) -> None:
        """Engage the clusters set so far, and later ones, with ``aware`` until cancelled."""
        await self.clusters.run(aware)
