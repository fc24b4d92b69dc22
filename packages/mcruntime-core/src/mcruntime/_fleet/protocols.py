"""The protocols between providers, clusters and the components that use them.

A provider turns an outside source of truth into engaged clusters. It only
*discovers*: the lifecycle (start, engage, replace, remove, index replay,
health) lives in :class:`ClusterSet`, so every provider behaves the same at the
edges. Disengagement follows a cluster's lifetime: when its provider stops it,
everything engaged with it winds down (see :meth:`Cluster.on_stop`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from .._base.kind import Kind
from .._base.permissions import Permission
from .._cache.informer import IndexFunc

if TYPE_CHECKING:
    from .cluster import Cluster
    from .status import ClusterStatus


@runtime_checkable
class Aware(Protocol):
    """Something that wants to know about every cluster: controllers, the manager."""

    async def engage(self, name: str, cluster: Cluster) -> None:
        """Start using ``cluster``; must not block, must be idempotent for the same object."""
        ...


@runtime_checkable
class Provider(Protocol):
    """Hands out clusters by name and applies field indexes to all of them."""

    async def get(self, name: str) -> Cluster:
        """The engaged cluster of this name; raises :class:`ClusterNotFound`."""
        ...

    async def index_field(self, kind: Kind, name: str, extract: IndexFunc) -> None:
        """Index ``kind`` by ``extract`` in every cluster, now and later."""
        ...

    def statuses(self) -> Mapping[str, ClusterStatus]:
        """Frozen snapshots of every cluster's phase by name: what ``/readyz`` and the metrics show.

        Snapshots, never live objects, so a copy a caller keeps does not change
        under it. :class:`mcruntime.provider.ClusterSetProvider` answers this
        from its ClusterSet.
        """
        ...


@runtime_checkable
class ProviderRunnable(Protocol):
    """A provider that discovers clusters while it runs; the manager runs it."""

    async def run(self, aware: Aware) -> None:
        """Discover and engage clusters with ``aware`` until cancelled."""
        ...


@runtime_checkable
class DeclaresPermissions(Protocol):
    """Optional for providers, runnables and awares: the permissions they need themselves.

    ``mcruntime.rbac_for`` merges what every provider (a :class:`MultiProvider`'s
    members included), runnable and aware added to the manager returns here
    into the generated RBAC. A provider's own reads (its Secrets, its Cluster
    objects) are ``role="hub"`` permissions. Not part of :class:`Provider`:
    a provider without it still works, and contributes no rules.
    """

    def rbac_rules(self) -> Iterable[Permission]:
        """Every permission this component needs, whatever it is configured with."""
        ...
