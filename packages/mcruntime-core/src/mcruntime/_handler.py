"""Event handlers: which requests an event turns into.

A handler maps an :class:`Event` from one cluster to requests. The requests may
name the same cluster (the object itself, its owner) or, with
:func:`enqueue_mapped`, any other cluster: that is how a multi-cluster-aware
controller watches members and reconciles a hub object, or the reverse.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Protocol

from ._kind import Kind
from ._objects import JSON, metadata
from ._predicate import Event
from ._reconcile import Request


class EventHandler(Protocol):
    """Turns an event into the requests to enqueue."""

    def requests(self, event: Event) -> Iterable[Request]:
        """The requests this event calls for (possibly none)."""
        ...


class _ForObject:
    same_cluster = True  # its requests name the event's own cluster (lets a replay skip others)

    def requests(self, event: Event) -> Iterable[Request]:
        meta = metadata(event.object)
        return (Request(event.cluster, meta.get("namespace") or "", meta.get("name", "")),)

    def __repr__(self) -> str:
        return "enqueue_for_object()"


def enqueue_for_object() -> EventHandler:
    """Reconcile the object the event is about, in the cluster it came from."""
    return _ForObject()


class _ForOwner:
    same_cluster = True

    def __init__(self, owner: Kind, only_controller: bool) -> None:
        self._owner = owner
        self._only_controller = only_controller

    def _owners(self, cluster: str, obj: JSON) -> set[Request]:
        meta = metadata(obj)
        namespace = meta.get("namespace") or ""
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

    def requests(self, event: Event) -> Iterable[Request]:
        owners = self._owners(event.cluster, event.object)
        if event.old is not None:
            owners |= self._owners(event.cluster, event.old)  # an owner that was dropped hears too
        return owners

    def __repr__(self) -> str:
        return f"enqueue_for_owner({self._owner}, only_controller={self._only_controller})"


def enqueue_for_owner(owner: Kind, *, only_controller: bool = True) -> EventHandler:
    """Reconcile the owner(s) of the object, found through its ownerReferences.

    Owner references never cross clusters or namespaces, so the owner is looked
    for in the object's own cluster and namespace (cluster-scoped owners get an
    empty namespace when the object is cluster-scoped).
    """
    return _ForOwner(owner, only_controller)


MapFunction = Callable[[str, JSON], Iterable[Request]]


class _Mapped:
    def __init__(self, function: MapFunction) -> None:
        self._function = function

    def requests(self, event: Event) -> Iterable[Request]:
        found = list(self._function(event.cluster, event.object))
        if event.old is not None:
            found.extend(self._function(event.cluster, event.old))
        return found

    def __repr__(self) -> str:
        return f"enqueue_mapped({getattr(self._function, '__name__', self._function)!r})"


def enqueue_mapped(function: MapFunction) -> EventHandler:
    """Reconcile whatever ``function(cluster, object)`` returns; requests may name any cluster."""
    return _Mapped(function)
