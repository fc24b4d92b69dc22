"""Owner references: the garbage collector's links from an object to what owns it.

An owner reference makes the API server's garbage collector delete the
dependent when its owner goes, and a *controller* reference (at most one per
object) says which controller is responsible for it: ``enqueue_for_owner``
follows it back, and two controllers that both claim an object would fight
over it forever, so a second claim is refused. Owner references never cross
namespaces or clusters (the garbage collector would treat a reference it
cannot resolve as an owner that is gone, and delete the dependent); for
owners in another cluster use ``set_cluster_owner``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .._base.errors import MCRuntimeError
from .._base.objects import JSON

__all__ = ["AlreadyOwnedError", "set_controller_reference", "set_owner_reference"]


class AlreadyOwnedError(MCRuntimeError, ValueError):
    """The object already has a controller reference to a different owner.

    Raised instead of taking the object over: the other controller would
    take it back on its next reconcile, and the two would alternate forever.
    """

    def __init__(self, obj: Mapping[str, Any], owner: Mapping[str, Any]) -> None:
        self.object_name: str = _describe(obj)
        self.owner: str = f"{owner.get('kind')} {owner.get('name')!r}"
        super().__init__(f"{self.object_name} is already controlled by {self.owner}")


def _describe(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    key = f"{meta['namespace']}/{meta.get('name')}" if meta.get("namespace") else str(meta.get("name"))
    return f"{obj.get('kind', 'object')} {key!r}"


def _reference(owner: Mapping[str, Any], controller: bool) -> JSON:
    meta = owner.get("metadata") or {}
    missing = [
        field
        for field, value in (
            ("apiVersion", owner.get("apiVersion")),
            ("kind", owner.get("kind")),
            ("metadata.name", meta.get("name")),
            ("metadata.uid", meta.get("uid")),
        )
        if not value
    ]
    if missing:
        raise ValueError(
            f"owner {_describe(owner)} has no {', '.join(missing)}; use the object as the API server "
            "returned it (a uid is assigned at creation)"
        )
    reference: JSON = {
        "apiVersion": owner["apiVersion"],
        "kind": owner["kind"],
        "name": meta["name"],
        "uid": meta["uid"],
    }
    if controller:
        reference["controller"] = True
        reference["blockOwnerDeletion"] = True
    return reference


def _check_scope(owner: Mapping[str, Any], obj: Mapping[str, Any]) -> None:
    owner_namespace = (owner.get("metadata") or {}).get("namespace") or ""
    namespace = (obj.get("metadata") or {}).get("namespace") or ""
    if not owner_namespace or owner_namespace == namespace:
        return  # a cluster-scoped owner may own anything; a namespaced one, its namespace only
    where = f"namespace {namespace!r}" if namespace else "no namespace (cluster-scoped)"
    raise ValueError(
        f"{_describe(owner)} cannot own {_describe(obj)}: a namespaced owner owns objects of "
        f"its own namespace only, and the object has {where}"
    )


def _same_owner(reference: Mapping[str, Any], wanted: Mapping[str, Any]) -> bool:
    # Group, kind and name identify an owner across API versions (the garbage collector's rule).
    group = str(reference.get("apiVersion", "")).rpartition("/")[0]
    return (
        group == str(wanted["apiVersion"]).rpartition("/")[0]
        and reference.get("kind") == wanted["kind"]
        and reference.get("name") == wanted["name"]
    )


def _upsert(obj: JSON, wanted: JSON) -> bool:
    meta = obj.setdefault("metadata", {})
    references: list[JSON] = meta.setdefault("ownerReferences", [])
    for index, reference in enumerate(references):
        if _same_owner(reference, wanted):
            if reference == wanted:
                return False
            references[index] = wanted
            return True
    references.append(wanted)
    return True


def set_controller_reference(owner: Mapping[str, Any], obj: JSON) -> bool:
    """Make ``owner`` the controller of ``obj`` (in ``obj`` only); ``True`` if it changed.

    The reference blocks the owner's foreground deletion until ``obj`` is
    gone. Raises :class:`AlreadyOwnedError` when another object is already
    its controller, and :class:`ValueError` when the owner lacks a uid or
    lives in another namespace than ``obj`` (a namespaced owner cannot own a
    cluster-scoped object either).
    """
    wanted = _reference(owner, controller=True)
    _check_scope(owner, obj)
    for reference in (obj.get("metadata") or {}).get("ownerReferences") or []:
        if reference.get("controller") and not _same_owner(reference, wanted):
            raise AlreadyOwnedError(obj, reference)
    return _upsert(obj, wanted)


def set_owner_reference(owner: Mapping[str, Any], obj: JSON) -> bool:
    """Add ``owner`` to ``obj``'s owners, not as its controller; ``True`` if it changed.

    For shared ownership: the garbage collector deletes ``obj`` only when
    every owner is gone. An existing reference to the same owner is replaced
    (its ``controller`` flag dropped), as controller-runtime does.
    """
    wanted = _reference(owner, controller=False)
    _check_scope(owner, obj)
    return _upsert(obj, wanted)
