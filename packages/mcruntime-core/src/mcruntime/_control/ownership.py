"""Cross-cluster ownership: a child in one cluster that points at its owner in another.

Owner references cannot do this: they name no cluster, and the garbage
collector deletes a dependent whose owner it cannot find, so an owner
reference to an object in another cluster gets the child deleted at once.
A cross-cluster owner is recorded in the child's metadata instead, in a
form every API server accepts whatever the names involved:

- the annotation ``multicluster.mcruntime.dev/owner`` holds the owner as
  JSON (cluster, apiVersion, kind, namespace, name, uid). Annotations have no
  per-value length limit and no character rules, so any cluster name (a
  provider's ``file/context``, a 200-character Cluster API name) is stored
  exactly. It is the record the handler and the cleanup read.
- two labels make children findable by selector, which annotations are not:
  ``multicluster.mcruntime.dev/owner-uid`` (the owner's uid: one list finds
  an owner's children) and ``multicluster.mcruntime.dev/owner-kind``
  (``Kind.group``: a controller watches only the children of its owner kind).
  A label value must be at most 63 characters of ``[A-Za-z0-9._-]``,
  starting and ending alphanumeric. A value that is not one as it stands
  (a uid is 36, but a long group is not, and a uid is only conventionally
  a UUID) is replaced by ``sha256-`` and the first 40 hex digits of its
  SHA-256 (47 characters). :func:`label_value` is that rule; selectors
  computed with it always match. A label is only an index: everything that
  acts on a child checks the annotation too, so even a hash collision
  could not make one owner's cleanup delete another's child.
"""

from __future__ import annotations

import hashlib
import logging
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from .._base.errors import MCRuntimeError
from .._base.kind import Kind
from .._base.objects import JSON, metadata
from .._reconcile.request import Request
from .handler import EventHandler, HandlerDefaults
from .predicate import ObjectEvent

__all__ = [
    "OWNER_ANNOTATION",
    "OWNER_KIND_LABEL",
    "OWNER_UID_LABEL",
    "AlreadyOwnedByClusterError",
    "ClusterOwner",
    "cluster_owner_of",
    "enqueue_for_cluster_owner",
    "label_value",
    "owned_by_kind_selector",
    "set_cluster_owner",
]

log = logging.getLogger("mcruntime.toolkit")

OWNER_ANNOTATION = "multicluster.mcruntime.dev/owner"
"""Annotation on a child: its cross-cluster owner, as JSON (the authoritative record)."""
OWNER_UID_LABEL = "multicluster.mcruntime.dev/owner-uid"
"""Label on a child: its owner's uid (through :func:`label_value`), to list an owner's children."""
OWNER_KIND_LABEL = "multicluster.mcruntime.dev/owner-kind"
"""Label on a child: its owner's ``Kind.group`` (through :func:`label_value`), to watch one owner kind."""

_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_MAX_LABEL_VALUE = 63
_MAX_ANNOTATION = 4096  # an owner record is a few hundred bytes; more is not one of ours


def label_value(text: str) -> str:
    """``text`` if it is a valid label value, else ``sha256-`` and 40 hex digits of its hash.

    Deterministic, so a selector computed from the same text matches.
    """
    if len(text) <= _MAX_LABEL_VALUE and _LABEL_VALUE.match(text):
        return text
    return "sha256-" + hashlib.sha256(text.encode()).hexdigest()[:40]


def _kind_key(kind: Kind) -> str:
    return f"{kind.kind}.{kind.group}" if kind.group else kind.kind


@dataclass(frozen=True)
class ClusterOwner:
    """An owner anywhere in the fleet: its cluster (as this manager names it) and its identity.

    ``cluster`` is ``""`` for the manager's local cluster, as in a
    :class:`~mcruntime.Request`. The uid tells this owner from a later object
    of the same name: a child whose owner was deleted and recreated belongs
    to the old one.
    """

    cluster: str
    api_version: str
    kind: str
    namespace: str
    name: str
    uid: str

    @classmethod
    def of(cls, cluster: str, owner: Mapping[str, Any]) -> ClusterOwner:
        """The owner record of ``owner``, an object as read from cluster ``cluster``."""
        meta = metadata(owner)
        api_version, kind = owner.get("apiVersion"), owner.get("kind")
        name, uid = meta.get("name"), meta.get("uid")
        missing = [
            field
            for field, value in (("apiVersion", api_version), ("kind", kind), ("name", name), ("uid", uid))
            if not value
        ]
        if missing:
            raise ValueError(
                f"cluster {cluster!r}: an owner needs {', '.join(missing)} (use the object as the API "
                "server returned it; a uid is assigned at creation)"
            )
        namespace = str(meta.get("namespace") or "")
        return cls(cluster, str(api_version), str(kind), namespace, str(name), str(uid))

    @property
    def kind_of(self) -> Kind:
        """The owner's :class:`~mcruntime.Kind`."""
        return Kind(self.api_version, self.kind)

    def request(self) -> Request:
        """The request that reconciles the owner."""
        return Request(self.cluster, self.namespace, self.name)

    def labels(self) -> dict[str, str]:
        """The labels a child of this owner carries."""
        return {
            OWNER_UID_LABEL: label_value(self.uid),
            OWNER_KIND_LABEL: label_value(_kind_key(self.kind_of)),
        }

    def selector(self) -> dict[str, str]:
        """A label selector matching this owner's children (in any cluster)."""
        return self.labels()

    def annotation(self) -> str:
        """The owner record as the annotation stores it."""
        record = {
            "cluster": self.cluster,
            "apiVersion": self.api_version,
            "kind": self.kind,
            "namespace": self.namespace,
            "name": self.name,
            "uid": self.uid,
        }
        return orjson.dumps(record).decode()

    def owns(self, child: Mapping[str, Any]) -> bool:
        """Whether ``child``'s owner record names this very owner (uid included)."""
        return cluster_owner_of(child) == self


class AlreadyOwnedByClusterError(MCRuntimeError, ValueError):
    """The child already has a different cross-cluster owner.

    Raised instead of taking the child over: its owner's controller would
    take it back, and its cleanup would delete a child another owner uses.
    """


def set_cluster_owner(child: JSON, owner_cluster: str, owner: Mapping[str, Any]) -> ClusterOwner:
    """Mark ``child`` (in ``child`` only) as owned by ``owner`` of cluster ``owner_cluster``.

    Sets the owner annotation and the two labels; write the child afterwards
    (create it, or patch it). Setting the same owner again changes nothing.
    Raises :class:`AlreadyOwnedByClusterError` when another owner (another
    uid, or the same name in another cluster) already owns it.
    """
    record = ClusterOwner.of(owner_cluster, owner)
    existing = cluster_owner_of(child)
    if existing is not None and existing != record:
        raise AlreadyOwnedByClusterError(
            f"{child.get('kind', 'object')} {metadata(child).get('name')!r} is already owned by "
            f"{existing.kind} {existing.namespace}/{existing.name} of cluster {existing.cluster!r}"
        )
    meta = child.setdefault("metadata", {})
    meta.setdefault("labels", {}).update(record.labels())
    meta.setdefault("annotations", {})[OWNER_ANNOTATION] = record.annotation()
    return record


def cluster_owner_of(child: Mapping[str, Any]) -> ClusterOwner | None:
    """The cross-cluster owner recorded on ``child``, or ``None``.

    A missing, oversized or malformed record is ``None`` (logged at debug):
    annotations are editable by anyone who can edit the child, and a broken
    one must neither crash a handler nor point a cleanup anywhere.
    """
    raw = (metadata(child).get("annotations") or {}).get(OWNER_ANNOTATION)
    if not isinstance(raw, str) or not raw or len(raw) > _MAX_ANNOTATION:
        return None
    try:
        record = orjson.loads(raw)
    except orjson.JSONDecodeError:
        log.debug("ignoring a malformed %s annotation on %s", OWNER_ANNOTATION, metadata(child).get("name"))
        return None
    fields = ("cluster", "apiVersion", "kind", "namespace", "name", "uid")
    if not isinstance(record, dict) or not all(isinstance(record.get(field), str) for field in fields):
        log.debug("ignoring an incomplete %s annotation on %s", OWNER_ANNOTATION, metadata(child).get("name"))
        return None
    if not all(record[field] for field in ("apiVersion", "kind", "name", "uid")):
        return None
    return ClusterOwner(
        record["cluster"],
        record["apiVersion"],
        record["kind"],
        record["namespace"],
        record["name"],
        record["uid"],
    )


def owned_by_kind_selector(owner_kind: Kind) -> str:
    """A label selector for children owned by objects of ``owner_kind`` (any cluster, any owner).

    Two uses. To keep each cluster's cache to those children, not every object
    of the child kind, scope the cache:
    ``ClusterOptions(cache=CacheOptions(by_object={CHILD: ByObject(label_selector=...)}))``.
    Passed to a builder's ``watches(..., label_selector=...)`` it filters the
    events that reach the controller only: the cache still holds every object
    of the kind.
    """
    return f"{OWNER_KIND_LABEL}={label_value(_kind_key(owner_kind))}"


class _ForClusterOwner(HandlerDefaults):
    def __init__(self, owner_kind: Kind) -> None:
        self._owner_kind = owner_kind

    def _owner(self, obj: Mapping[str, Any]) -> Request | None:
        owner = cluster_owner_of(obj)
        if owner is None or owner.kind != self._owner_kind.kind:
            return None
        if owner.kind_of.group != self._owner_kind.group:
            return None  # owners match on group and kind, any version
        return owner.request()

    def requests(self, event: ObjectEvent) -> Iterable[Request]:
        found = {self._owner(event.object)}
        if event.old is not None:
            found.add(self._owner(event.old))  # an owner the child was taken from hears too
        return [request for request in found if request is not None]

    def __repr__(self) -> str:
        return f"enqueue_for_cluster_owner({self._owner_kind})"


def enqueue_for_cluster_owner(owner_kind: Kind) -> EventHandler:
    """Reconcile a child's cross-cluster owner of ``owner_kind``, whichever cluster the child is in.

    The request names the owner's cluster, read from the child's owner
    record, not the cluster the event came from: a Job changing in
    ``cluster-7`` reconciles its Test on the hub. Children of other owner
    kinds, and objects without a (valid) owner record, map to nothing.
    """
    return _ForClusterOwner(owner_kind)
