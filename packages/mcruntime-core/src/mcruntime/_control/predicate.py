"""Event filters: which events are worth a reconcile.

A predicate sees an :class:`ObjectEvent` and the name of the cluster it came from,
and returns whether to enqueue. The "changed" predicates judge updates only and
let creates and deletes through, so ``generation_changed()`` on ``for_`` still
reconciles new and deleted objects, as in controller-runtime.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Literal

from .._base.labels import LabelSelector
from .._base.objects import JSON, metadata

EventType = Literal["create", "update", "delete", "generic"]


@dataclass(frozen=True)
class ObjectEvent:
    """Something that happened to an object in one cluster (``old`` is set for updates)."""

    type: EventType
    cluster: str
    object: JSON
    old: JSON | None = field(default=None, compare=False)


def describe_event(event: ObjectEvent) -> str:
    """An event as a log line names it: ``update of ConfigMap apps/cfg in cluster 'east'``."""
    meta = event.object.get("metadata")
    meta = meta if isinstance(meta, dict) else {}
    where = f"{meta.get('namespace')}/{meta.get('name')}" if meta.get("namespace") else str(meta.get("name"))
    return f"{event.type} of {event.object.get('kind', 'an object')} {where} in cluster {event.cluster!r}"


Predicate = Callable[[ObjectEvent], bool]
"""Decides whether an event reaches the work queue; combine them with ``all_of``/``any_of``/``negate``."""


def _on_update(compare: Callable[[JSON, JSON], bool]) -> Predicate:
    def predicate(event: ObjectEvent) -> bool:
        if event.type != "update" or event.old is None:
            return True
        return compare(event.old, event.object)

    return predicate


def _meta_changed(key: str) -> Callable[[JSON, JSON], bool]:
    return lambda old, new: metadata(old).get(key) != metadata(new).get(key)


def generation_changed() -> Predicate:
    """Updates that changed ``metadata.generation`` (spec changes; not status-only writes)."""
    return _on_update(_meta_changed("generation"))


def labels_changed() -> Predicate:
    """Updates that changed the labels."""
    return _on_update(_meta_changed("labels"))


def annotations_changed() -> Predicate:
    """Updates that changed the annotations."""
    return _on_update(_meta_changed("annotations"))


def resource_version_changed() -> Predicate:
    """Updates that changed anything (drops resync re-deliveries of unchanged objects)."""
    return _on_update(_meta_changed("resourceVersion"))


def in_namespaces(*namespaces: str) -> Predicate:
    """Objects in one of these namespaces."""
    allowed = frozenset(namespaces)
    return lambda event: metadata(event.object).get("namespace") in allowed


def has_labels(selector: str | Mapping[str, str]) -> Predicate:
    """Objects whose labels match a selector (the server's syntax, or a mapping)."""
    parsed = LabelSelector.parse(selector)
    return lambda event: parsed.matches(metadata(event.object).get("labels"))


def in_clusters(*clusters: str) -> Predicate:
    """Events from these clusters only."""
    allowed = frozenset(clusters)
    return lambda event: event.cluster in allowed


def all_of(*predicates: Predicate) -> Predicate:
    """True when every predicate is (and for none)."""
    return lambda event: all(predicate(event) for predicate in predicates)


def any_of(*predicates: Predicate) -> Predicate:
    """True when at least one predicate is."""
    return lambda event: any(predicate(event) for predicate in predicates)


def negate(predicate: Predicate) -> Predicate:
    """The opposite of ``predicate``."""
    return lambda event: not predicate(event)


def matches(predicates: tuple[Predicate, ...], event: ObjectEvent) -> bool:
    """Whether an event passes every predicate."""
    # A loop, not all(...): no generator per event (this runs for every event of every cluster).
    for predicate in predicates:  # noqa: SIM110
        if not predicate(event):
            return False
    return True
