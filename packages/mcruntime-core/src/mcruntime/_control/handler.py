"""Event handlers: which requests an event turns into.

A handler maps an :class:`ObjectEvent` from one cluster to requests. The requests may
name the same cluster (the object itself, its owner) or, with
:func:`enqueue_mapped`, any other cluster: that is how a multi-cluster-aware
controller watches members and reconciles a hub object, or the reverse.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Protocol

from .._base.kind import Kind
from .._base.objects import JSON, metadata
from .._reconcile.request import Request
from .predicate import ObjectEvent

if TYPE_CHECKING:
    from .._fleet.cluster import Cluster


class EventHandler(Protocol):
    """Turns an event into the requests to enqueue.

    Three members, all called by the controller: :meth:`requests` for each
    event; :meth:`bind_cluster` when the handler is attached to a cluster, for
    handlers that consult that cluster (its discovery, say); and
    :attr:`same_cluster`, which lets a replay of one cluster skip the others
    when every request names the event's own cluster. Subclass
    :class:`HandlerDefaults` to get the usual answers to the last two.
    """

    @property
    def same_cluster(self) -> bool:
        """Whether every request names the cluster the event came from (``False`` if it may name any)."""
        ...

    def bind_cluster(self, name: str, cluster: Cluster) -> None:
        """The controller attaches this handler to ``cluster`` (called again when the cluster is replaced).

        A handler that keeps the cluster must let go of it when it stops
        (``cluster.on_stop``): holding it keeps its client and caches alive.
        """
        ...

    def requests(self, event: ObjectEvent) -> Iterable[Request]:
        """The requests this event calls for (possibly none)."""
        ...


class HandlerDefaults:
    """The usual answers for a handler: requests may name any cluster, and no cluster needs binding."""

    same_cluster: bool = False

    def bind_cluster(self, name: str, cluster: Cluster) -> None:
        """Nothing to learn from the cluster."""
        del name, cluster


class _ForObject(HandlerDefaults):
    same_cluster = True  # its requests name the event's own cluster (lets a replay skip others)

    def requests(self, event: ObjectEvent) -> Iterable[Request]:
        meta = metadata(event.object)
        return (Request(event.cluster, meta.get("namespace") or "", meta.get("name", "")),)

    def __repr__(self) -> str:
        return "enqueue_for_object()"


def enqueue_for_object() -> EventHandler:
    """Reconcile the object the event is about, in the cluster it came from."""
    return _ForObject()


class _ForOwner(HandlerDefaults):
    same_cluster = True

    def __init__(self, owner: Kind, only_controller: bool, namespaced: bool | None) -> None:
        self._owner = owner
        self._only_controller = only_controller
        self._namespaced = namespaced
        self._clusters: dict[str, Cluster] = {}
        self._scope: dict[str, bool] = {}  # learnt per cluster from its discovery

    def bind_cluster(self, name: str, cluster: Cluster) -> None:
        """Called by the controller when it attaches this handler to a cluster (for scope lookups)."""
        if self._clusters.get(name) is not cluster:
            self._clusters[name] = cluster
            self._scope.pop(name, None)
            cluster.on_stop(functools.partial(self._unbind, name, cluster))

    def _unbind(self, name: str, cluster: Cluster) -> None:
        # A stopped cluster, its client and its caches must not outlive their engagement here
        # (a fleet that replaces clusters would keep every old instance otherwise).
        if self._clusters.get(name) is cluster:
            del self._clusters[name]
            self._scope.pop(name, None)

    def _owner_namespaced(self, cluster: str) -> bool | None:
        if self._namespaced is not None:
            return self._namespaced
        known = self._scope.get(cluster)
        if known is not None:
            return known
        bound = self._clusters.get(cluster)
        if bound is None:
            return None
        for resource in bound.client.discovery.resources():
            if resource.kind == self._owner.kind and resource.group == self._owner.group:
                self._scope[cluster] = resource.namespaced
                return resource.namespaced
        return None

    def _owners(self, cluster: str, obj: JSON) -> set[Request]:
        meta = metadata(obj)
        namespaced = self._owner_namespaced(cluster)
        # Unknown scope (the owner kind is not served there): a namespaced child's owner is
        # looked for in its namespace, the only place a namespaced owner may live.
        namespace = "" if namespaced is False else meta.get("namespace") or ""
        found = set()
        for reference in meta.get("ownerReferences") or []:
            if reference.get("kind") != self._owner.kind:
                continue
            if reference.get("apiVersion", "").rpartition("/")[0] != self._owner.group:
                continue  # owner references match on group and kind, any version
            if self._only_controller and not reference.get("controller"):
                continue
            found.add(Request(cluster, namespace, reference.get("name", "")))
        return found

    def requests(self, event: ObjectEvent) -> Iterable[Request]:
        owners = self._owners(event.cluster, event.object)
        if event.old is not None:
            owners |= self._owners(event.cluster, event.old)  # an owner that was dropped hears too
        return owners

    def __repr__(self) -> str:
        return f"enqueue_for_owner({self._owner}, only_controller={self._only_controller})"


def enqueue_for_owner(
    owner: Kind, *, only_controller: bool = True, namespaced: bool | None = None
) -> EventHandler:
    """Reconcile the owner(s) of the object, found through its ownerReferences.

    Owner references never cross clusters, and a namespaced owner is always in
    its dependent's namespace; but a cluster-scoped owner (a Namespace, a
    ClusterRole, a cluster-scoped custom resource) has no namespace at all, and
    its request must not borrow the child's, or the owner looks deleted. An
    owner reference does not say which scope its kind has, so the handler asks:
    ``namespaced`` states it outright; left ``None``, the scope is read from
    each cluster's discovery cache, which a controller hands the handler when
    it attaches it to a cluster (``bind_cluster``). That costs no request: the
    informers feeding the handler have loaded discovery before any event
    arrives. Discovery rather than a flag by default because the same kind's
    scope is a fact of the cluster, so users of ``owns(...)`` need not repeat it.
    """
    return _ForOwner(owner, only_controller, namespaced)


MapFunction = Callable[[str, JSON], Iterable[Request]]


class _Mapped(HandlerDefaults):
    def __init__(self, function: MapFunction) -> None:
        self._function = function

    def requests(self, event: ObjectEvent) -> Iterable[Request]:
        found = list(self._function(event.cluster, event.object))
        if event.old is not None:
            found.extend(self._function(event.cluster, event.old))
        return found

    def __repr__(self) -> str:
        return f"enqueue_mapped({getattr(self._function, '__name__', self._function)!r})"


def enqueue_mapped(function: MapFunction) -> EventHandler:
    """Reconcile whatever ``function(cluster, object)`` returns; requests may name any cluster.

    ``function`` is a plain function: it runs in the informer's callback, for
    every event, so it must not block or await (read what it needs from the
    object; look further in the reconcile it asks for).
    """
    if inspect.iscoroutinefunction(function):
        name = getattr(function, "__qualname__", repr(function))
        raise TypeError(
            f"enqueue_mapped({name}): a map function is a plain function returning requests, "
            "not an async one (it runs in the informer's callback for every event)"
        )
    return _Mapped(function)
