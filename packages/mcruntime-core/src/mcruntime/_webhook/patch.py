"""The JSON patch (RFC 6902) that turns one JSON document into another.

A defaulter returns the object it wants; the API server wants the operations
that get there. The diff recurses into objects (so a defaulted field is one
``add``, not a rewrite of the whole object) and replaces a list that changed
as a whole: positions in a list of containers or ports are not stable
identities, and a whole-list ``replace`` is always correct, where an
index-wise diff is only correct when nothing was inserted in the middle.
"""

from __future__ import annotations

from typing import Any

__all__ = ["json_patch", "pointer"]


def pointer(path: tuple[str, ...]) -> str:
    """An RFC 6901 JSON pointer: ``~`` and ``/`` inside keys are escaped as ``~0`` and ``~1``."""
    return "".join("/" + part.replace("~", "~0").replace("/", "~1") for part in path)


def json_patch(original: Any, changed: Any) -> list[dict[str, Any]]:
    """The operations that turn ``original`` into ``changed`` (empty when they are equal)."""
    operations: list[dict[str, Any]] = []
    _diff(original, changed, (), operations)
    return operations


def _same(left: Any, right: Any) -> bool:
    # 1 == 1.0 == True in Python, but not in JSON: a defaulter turning true into 1 is a change.
    return type(left) is type(right) and left == right


def _diff(original: Any, changed: Any, path: tuple[str, ...], out: list[dict[str, Any]]) -> None:
    if isinstance(original, dict) and isinstance(changed, dict):
        for key in original:
            if key not in changed:
                out.append({"op": "remove", "path": pointer((*path, str(key)))})
        for key, value in changed.items():
            if key not in original:
                out.append({"op": "add", "path": pointer((*path, str(key))), "value": value})
            else:
                _diff(original[key], value, (*path, str(key)), out)
        return
    if not _same(original, changed):
        out.append({"op": "replace", "path": pointer(path), "value": changed})
