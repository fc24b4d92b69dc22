"""Sources: where a controller's events come from, and from which clusters.

A :class:`KindSource` watches one kind through each engaged cluster's shared
informer. Which clusters it binds to is a :class:`ClusterSelection`: the local
(hub) cluster, the provider's clusters, or both, with one filter that applies
to all of them, the local cluster included. A :class:`ChannelSource` lets code
outside Kubernetes (a webhook, a timer, another controller) trigger reconciles.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .._base.kind import Kind
from .._base.labels import LabelSelector
from .._base.objects import JSON, metadata
from .._cache.informer import HandlerRegistration, Informer, ResourceEventHandler
from .._reconcile.request import LOCAL_CLUSTER, Request
from .handler import EventHandler, enqueue_for_object
from .predicate import ObjectEvent, Predicate

if TYPE_CHECKING:
    from .._fleet.cluster import Cluster

Sink = Callable[[ObjectEvent], None]
ClusterFilter = Callable[[str], bool]


@dataclass(frozen=True)
class ClusterSelection:
    """Which clusters a source binds to.

    ``local`` and ``provider`` left as ``None`` take the manager's default:
    provider clusters when the manager has a provider, the local cluster when
    it has none, which is what lets one reconciler run unchanged in both modes.
    ``filter`` gets the cluster name and applies to every cluster, local too.
    """

    local: bool | None = None
    provider: bool | None = None
    filter: ClusterFilter | None = None

    def includes(self, cluster: str, *, has_provider: bool) -> bool:
        """Whether a cluster of this name is selected under the manager's defaults."""
        if cluster == LOCAL_CLUSTER:
            wanted = self.local if self.local is not None else not has_provider
        else:
            wanted = self.provider if self.provider is not None else has_provider
        return wanted and (self.filter is None or self.filter(cluster))


LOCAL_ONLY = ClusterSelection(local=True, provider=False)
"""Watch the manager's own (hub) cluster only."""
PROVIDER_ONLY = ClusterSelection(local=False, provider=True)
"""Watch the provider's clusters only, not the hub."""
EVERY_CLUSTER = ClusterSelection(local=True, provider=True)
"""Watch the hub and every provider cluster."""


@dataclass
class Attachment:
    """A source attached to one cluster: its informer and the handler registration."""

    informer: Informer
    registration: HandlerRegistration
    wanted: Callable[[JSON], bool]
    optional: bool = False
    release: Callable[[], None] = lambda: None

    def detach(self) -> None:
        self.registration.remove()
        self.release()

    async def settle(self, timeout: float | None) -> bool:
        """Wait for the informer's sync (or, for an optional kind, the cluster's lack of it)."""
        if self.optional:
            return await self.informer.wait_for_sync_or_absence(timeout)
        return await self.informer.wait_for_sync(timeout)


@dataclass
class KindSource:
    """Events for objects of one kind in every selected cluster."""

    kind: Kind
    handler: EventHandler = field(default_factory=enqueue_for_object)
    predicates: tuple[Predicate, ...] = ()
    clusters: ClusterSelection = field(default_factory=ClusterSelection)
    namespace: str | None = None
    label_selector: str | Mapping[str, str] | None = None
    metadata_only: bool = False
    """Watch the kind's metadata view: events carry ``apiVersion``, ``kind`` and ``metadata`` only."""
    optional: bool = False
    """The kind may be missing from some clusters (a CRD installed on some members only).

    Where it is, the controller counts as synced and health does not count it;
    its objects arrive once it is installed.
    """

    def attach(self, cluster_name: str, cluster: Cluster, sink: Sink) -> Attachment:
        """Register on the cluster's shared informer for the kind (started if needed); never blocks.

        The source uses the same kind-wide informer that the cluster's reader
        serves reads from, and applies ``namespace`` and ``label_selector``
        itself: a reconcile triggered by an event then always reads a cache at
        least as new as that event. (Two informers on one kind would race.)
        A metadata-only source uses the kind's metadata view, which reads with
        ``metadata_only=True`` see.
        """
        informer = cluster.cache.informer(self.kind, metadata_only=self.metadata_only)
        selector = LabelSelector.parse(self.label_selector)
        namespace = self.namespace

        def wanted(obj: JSON) -> bool:
            meta = metadata(obj)
            if namespace is not None and meta.get("namespace") != namespace:
                return False
            return selector.empty or selector.matches(meta.get("labels"))

        def on_add(obj: JSON, _initial: bool) -> None:
            if wanted(obj):
                sink(ObjectEvent("create", cluster_name, obj))

        def on_update(old: JSON, new: JSON) -> None:
            if wanted(new) or wanted(old):
                sink(ObjectEvent("update", cluster_name, new, old))

        def on_delete(obj: JSON) -> None:
            if wanted(obj):
                sink(ObjectEvent("delete", cluster_name, obj))

        release = informer.presence.hold(optional=self.optional)
        registration = informer.add_handler(ResourceEventHandler(on_add, on_update, on_delete))
        return Attachment(informer, registration, wanted, self.optional, release)


@dataclass
class ChannelSource:
    """Triggers from outside the clusters.

    Put a :class:`Request` on ``channel`` to enqueue it, or an :class:`ObjectEvent`
    to run it through ``handler`` and ``predicates`` first.
    """

    channel: asyncio.Queue[Request | ObjectEvent]
    handler: EventHandler = field(default_factory=enqueue_for_object)
    predicates: tuple[Predicate, ...] = ()
