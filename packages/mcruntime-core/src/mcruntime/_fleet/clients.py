"""Clients for reconcilers: one that follows the request, one that spans the fleet.

:class:`RoutedClient` is "the client" of a single-cluster reconciler: inside a
reconcile it addresses the request's cluster (found through contextvars), so a
reconciler written for one cluster runs unchanged across a fleet. Reads come
from the cache, writes go to the API server, as with controller-runtime's
default client.

:class:`FleetClient` reads across every engaged cluster at once and reports
per-cluster results and per-cluster errors: one unreachable cluster never fails
the whole call.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from .._base.errors import ClusterNotFound
from .._base.kind import Kind
from .._base.objects import JSON
from .._client.protocols import Reader
from .._reconcile.context import current_request
from .._reconcile.request import LOCAL_CLUSTER

if TYPE_CHECKING:
    from .cluster import Cluster

T = TypeVar("T")
Objects = list[JSON]
ClusterLookup = Callable[[str], Awaitable["Cluster"]]
EngagedClusters = Callable[[], Mapping[str, "Cluster"]]


class RoutedClient:
    """Reads (cached) and writes in the cluster of the request being reconciled.

    Outside a reconcile it addresses the local cluster, if the manager has one.
    """

    def __init__(self, lookup: ClusterLookup) -> None:
        self._lookup = lookup

    async def cluster(self) -> Cluster:
        """The cluster this client addresses right now.

        Outside a reconcile, without a local cluster, there is nothing to
        address: the error says so and how to name a cluster instead, rather
        than that a cluster called ``''`` is not engaged.
        """
        request = current_request()
        if request is not None:
            return await self._lookup(request.cluster)
        try:
            return await self._lookup(LOCAL_CLUSTER)
        except ClusterNotFound:
            raise ClusterNotFound(
                LOCAL_CLUSTER,
                "mgr.client was used outside a reconcile and the manager has no local cluster; "
                "address a cluster explicitly: (await mgr.get_cluster(name)).client",
            ) from None

    async def get(
        self, kind: Kind, name: str, *, namespace: str | None = None, metadata_only: bool = False
    ) -> JSON:
        """A copy from the request's cluster's cache; raises :class:`NotFound` when it has none.

        ``metadata_only`` reads the kind's metadata view (the one a builder's
        ``metadata_only=True`` fills), so a reconciler watching metadata only
        does not make the cache hold every object whole as well.
        """
        cluster = await self.cluster()
        return await cluster.cache.get(kind, name, namespace=namespace, metadata_only=metadata_only)

    async def get_or_none(
        self, kind: Kind, name: str, *, namespace: str | None = None, metadata_only: bool = False
    ) -> JSON | None:
        """A copy from the request's cluster's cache, or ``None`` when it has none (see :meth:`get`)."""
        cluster = await self.cluster()
        return await cluster.cache.get_or_none(kind, name, namespace=namespace, metadata_only=metadata_only)

    async def list(
        self,
        kind: Kind,
        *,
        namespace: str | None = None,
        label_selector: str | Mapping[str, str] | None = None,
        index: tuple[str, str] | None = None,
        metadata_only: bool = False,
    ) -> list[JSON]:
        """Copies from the cache (``metadata_only``: from the kind's metadata view, see :meth:`get`)."""
        cluster = await self.cluster()
        return await cluster.cache.list(
            kind, namespace=namespace, label_selector=label_selector, index=index, metadata_only=metadata_only
        )

    async def create(self, obj: Any, **options: Any) -> JSON:
        return await (await self.cluster()).client.create(obj, **options)

    async def update(self, obj: Any, **options: Any) -> JSON:
        return await (await self.cluster()).client.update(obj, **options)

    async def update_status(self, obj: Any, **options: Any) -> JSON:
        return await (await self.cluster()).client.update_status(obj, **options)

    async def patch(self, kind: Kind, name: str, patch: Any, **options: Any) -> JSON:
        return await (await self.cluster()).client.patch(kind, name, patch, **options)

    async def apply(self, obj: Any, *, field_manager: str | None = None, **options: Any) -> JSON:
        """Server-side apply in the request's cluster; ``field_manager`` defaults to the manager's."""
        return await (await self.cluster()).client.apply(obj, field_manager=field_manager, **options)

    async def delete(self, kind: Kind, name: str, **options: Any) -> JSON | None:
        return await (await self.cluster()).client.delete(kind, name, **options)


@dataclass
class FleetResult:
    """Per-cluster answers of a fleet-wide read; a cluster is in exactly one of the two maps."""

    results: dict[str, Any] = field(default_factory=dict)
    errors: dict[str, Exception] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.errors


class FleetClient:
    """Reads across all engaged clusters concurrently, each bounded by a timeout."""

    def __init__(self, engaged: EngagedClusters, *, timeout: float = 10.0) -> None:
        self._engaged = engaged
        self._timeout = timeout

    async def _each(
        self, read: Callable[[Cluster], Awaitable[T]], clusters: Sequence[str] | None, timeout: float | None
    ) -> FleetResult:
        engaged = dict(self._engaged())
        names = clusters if clusters is not None else sorted(engaged)
        limit = self._timeout if timeout is None else timeout
        result = FleetResult()

        async def one(name: str) -> None:
            cluster = engaged.get(name)
            if cluster is None:
                result.errors[name] = ClusterNotFound(name)
                return
            try:
                async with asyncio.timeout(limit):
                    result.results[name] = await read(cluster)
            except TimeoutError:
                result.errors[name] = TimeoutError(f"cluster {name!r} did not answer within {limit:.0f}s")
            except Exception as error:
                result.errors[name] = error

        await asyncio.gather(*(one(name) for name in names))
        return result

    async def list(
        self,
        kind: Kind,
        *,
        namespace: str | None = None,
        label_selector: str | Mapping[str, str] | None = None,
        clusters: Sequence[str] | None = None,
        source: Literal["cache", "api"] = "cache",
        timeout: float | None = None,
    ) -> FleetResult:
        """``results[cluster]`` is that cluster's list of objects."""

        async def read(cluster: Cluster) -> Objects:
            if source == "cache":
                return await cluster.cache.list(kind, namespace=namespace, label_selector=label_selector)
            listed = await cluster.client.list(kind, namespace=namespace, label_selector=label_selector)
            return listed.items

        return await self._each(read, clusters, timeout)

    async def get(
        self,
        kind: Kind,
        name: str,
        *,
        namespace: str | None = None,
        clusters: Sequence[str] | None = None,
        source: Literal["cache", "api"] = "cache",
        timeout: float | None = None,
    ) -> FleetResult:
        """``results[cluster]`` is the object, or ``None`` where that cluster has none."""

        async def read(cluster: Cluster) -> JSON | None:
            reader: Reader[object] = cluster.cache if source == "cache" else cluster.client
            return await reader.get_or_none(kind, name, namespace=namespace)

        return await self._each(read, clusters, timeout)
