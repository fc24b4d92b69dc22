"""What a cluster's cache holds: its namespaces, and per kind its selectors and transform.

A cache that holds every object of every kind it reads is the simplest and the
most expensive. :class:`CacheOptions` narrows it for the whole cluster (a set
of namespaces) and :class:`ByObject` per kind (its own namespaces, label and
field selectors, transform). The narrowing happens on the server: informers
list and watch only what is in scope, so objects out of scope cost neither
memory nor bandwidth, and need no ``list``/``watch`` permission.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Final

from .._base.kind import Kind
from .._base.labels import LabelSelector
from .informer import Transform


class _Inherit(Enum):
    """A marker distinct from ``None`` (which means "no transform")."""

    INHERIT = "inherit"


INHERIT: Final = _Inherit.INHERIT
"""For :attr:`ByObject.transform`: use the cluster's ``ClusterOptions.transform``."""


def _namespaces(value: Iterable[str] | None, where: str) -> tuple[str, ...] | None:
    if value is None:
        return None
    if isinstance(value, str):
        raise TypeError(f"{where}: give a list of namespaces, not the string {value!r}")
    names = tuple(dict.fromkeys(value))
    if not names:
        raise ValueError(f"{where}: an empty list of namespaces would cache nothing; use None for all")
    for name in names:
        if not isinstance(name, str) or not name:
            raise ValueError(f"{where}: {name!r} is not a namespace name")
    return tuple(sorted(names))


@dataclass(frozen=True)
class ByObject:
    """How the cache holds one kind (controller-runtime's ``ByObject``).

    Every field left as is takes the cluster's default. Objects a selector
    excludes are simply absent from the cache: ``get`` raises
    :class:`~mcruntime.NotFound` for them and ``list`` leaves them out, exactly
    as if they did not exist, and no event is delivered for them. An object
    whose labels change so that it leaves the selector is seen as deleted.
    """

    namespaces: Iterable[str] | None = None
    """The namespaces to cache this kind in, instead of :attr:`CacheOptions.namespaces`
    (ignored for cluster-scoped kinds)."""
    label_selector: str | Mapping[str, str] | None = None
    """Only objects with these labels (``"app=web,tier!=db"`` or a mapping)."""
    field_selector: str | None = None
    """Only objects matching this field selector (``"type=kubernetes.io/tls"``); the
    server supports a few fields per kind."""
    transform: Transform | _Inherit | None = INHERIT
    """Applied to every object before it is stored (``None`` keeps objects whole)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "namespaces", _namespaces(self.namespaces, "ByObject.namespaces"))
        # Parsed here so a bad selector fails when written, not in an informer; kept as
        # text so options stay hashable.
        object.__setattr__(self, "label_selector", LabelSelector.parse(self.label_selector).text or None)

    def transform_or(self, default: Transform | None) -> Transform | None:
        """This kind's transform, or ``default`` (the cluster's) when it inherits."""
        return default if isinstance(self.transform, _Inherit) else self.transform


@dataclass(frozen=True)
class CacheOptions:
    """The scope of a cluster's cache: ``ClusterOptions(cache=CacheOptions(...))``.

    ``namespaces`` limits every namespaced kind to those namespaces
    (controller-runtime's ``DefaultNamespaces``): one informer per namespace
    behind one view, so ``list`` merges them and needs only namespaced
    permissions. A read of a namespace outside the scope raises
    :class:`NamespaceNotCached` rather than answering empty. ``by_object``
    narrows single kinds further.
    """

    namespaces: Iterable[str] | None = None
    """Namespaces to cache (``None``: all of them)."""
    by_object: Mapping[Kind, ByObject] = field(default_factory=dict)
    """Per-kind scope, selectors and transform."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "namespaces", _namespaces(self.namespaces, "CacheOptions.namespaces"))
        for kind, scope in self.by_object.items():
            if not isinstance(kind, Kind) or not isinstance(scope, ByObject):
                raise TypeError(f"CacheOptions.by_object maps Kind to ByObject, not {kind!r} to {scope!r}")
        object.__setattr__(self, "by_object", dict(self.by_object))

    def __hash__(self) -> int:
        """Frozen options are hashable values (``ClusterOptions`` is); the mapping is not, its items are."""
        return hash((self.namespaces, frozenset(self.by_object.items())))


class NamespaceNotCached(ValueError):
    """A cache read asked for a namespace the cache does not hold.

    Raised rather than answering "nothing there": an empty answer would look
    like a deleted object. Read such objects with the client instead, or add
    the namespace to :class:`CacheOptions` or :class:`ByObject`.
    """

    def __init__(self, cluster: str, kind: Kind, namespace: str, cached: Iterable[str]) -> None:
        self.cluster = cluster
        self.kind = kind
        self.namespace = namespace
        self.cached: tuple[str, ...] = tuple(cached)
        held = ", ".join(repr(name) for name in self.cached)
        plural = "s" if len(self.cached) > 1 else ""
        super().__init__(
            f"cluster {cluster!r}: the cache of {kind} holds namespace{plural} {held} only, "
            f"not {namespace!r}; read it with the client, or add it to the cache's namespaces"
        )
