"""JSON merge patches (RFC 7386) computed from what an object was and what it should be.

A reconciler reads an object, changes a copy, and wants to send only the
change: a full update would overwrite whatever another writer changed in
between in fields this reconciler never touched, and a patch does not. A merge
patch is the simplest patch every API server accepts for every kind, custom
resources included. Its rules: an object in the patch merges key by key, a
``null`` deletes the key, and anything else (a list included) replaces the
value whole.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .._base.objects import JSON, json_copy

__all__ = ["apply_merge_patch", "merge_patch"]


def merge_patch(before: Mapping[str, Any], after: Mapping[str, Any]) -> JSON:
    """The merge patch that turns ``before`` into ``after``; ``{}`` when they are equal.

    A key missing from ``after`` becomes ``null`` (deleted), a changed
    mapping recurses, and every other changed value (lists included, since a
    merge patch cannot edit a list in place) is sent whole. A key whose value
    in ``after`` is ``None`` cannot be expressed, because ``null`` means
    "delete" in a merge patch: it is deleted, which is what the server would
    store for it anyway.
    """
    patch: JSON = {}
    for key in before:
        if key not in after:
            patch[key] = None
    for key, new in after.items():
        old = before.get(key, _MISSING)
        if old is _MISSING:
            if new is not None:
                patch[key] = json_copy(new)
            continue
        if isinstance(old, Mapping) and isinstance(new, Mapping):
            nested = merge_patch(old, new)
            if nested:
                patch[key] = nested
        elif new is None:
            patch[key] = None
        elif old != new or type(old) is not type(new):
            patch[key] = json_copy(new)
    return patch


def apply_merge_patch(target: Any, patch: Any) -> Any:
    """``target`` with ``patch`` applied as RFC 7386 says; neither input is changed.

    What the API server does with a merge patch, for predicting its answer
    (tests, dry runs) without a round trip. A patch that is not a mapping
    replaces the target whole.
    """
    if not isinstance(patch, Mapping):
        return json_copy(patch)
    result: JSON = json_copy(dict(target)) if isinstance(target, Mapping) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = apply_merge_patch(result.get(key), value)
    return result


_MISSING: Any = object()
