"""Status conditions the Kubernetes way: ``status.conditions``, keyed by ``type``.

Tools (``kubectl wait --for=condition=Ready``, Argo CD, dashboards) read
conditions with fixed rules, so a controller's conditions are only useful if
they follow them: one entry per ``type``; ``status`` is ``True``, ``False`` or
``Unknown``; ``lastTransitionTime`` is when ``status`` last changed, not when
the controller last looked (a timestamp that moves on every reconcile makes
every status write a change, and hides how long something has been failing);
``observedGeneration`` says which spec the condition was computed from, so a
reader can tell a stale ``Ready=True`` from a current one.
"""

from __future__ import annotations

import datetime
import re
from collections.abc import Mapping
from typing import Any

from .._base.objects import JSON

__all__ = [
    "find_status_condition",
    "is_status_condition_true",
    "remove_status_condition",
    "set_status_condition",
]

_STATUSES = ("True", "False", "Unknown")
# What the API server's validation of metav1.Condition accepts for a reason.
_REASON = re.compile(r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$")
_MAX_REASON = 1024
_MAX_MESSAGE = 32768


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _conditions(obj: Mapping[str, Any]) -> list[JSON]:
    status = obj.get("status")
    if not isinstance(status, Mapping):
        return []
    found = status.get("conditions")
    return found if isinstance(found, list) else []


def set_status_condition(
    obj: JSON,
    type: str,
    status: bool | str,
    *,
    reason: str,
    message: str = "",
    observed_generation: int | None = None,
    now: str | None = None,
) -> bool:
    """Set condition ``type`` in ``obj["status"]["conditions"]``; ``True`` if anything changed.

    ``lastTransitionTime`` moves (to ``now``, default the current time) only
    when the condition is new or its ``status`` differs; a changed reason or
    message alone keeps it, so the time still says how long the condition has
    held. ``observed_generation`` defaults to the object's
    ``metadata.generation``: the condition describes the spec just read. The
    change is made in ``obj`` only; write it with a status update or patch
    when this returns ``True`` (and skip the write otherwise).

    Raises :class:`ValueError` naming the field when ``status`` or ``reason``
    would be refused by the API server.
    """
    if isinstance(status, bool):
        status = "True" if status else "False"
    if status not in _STATUSES:
        raise ValueError(f"condition {type!r}: status must be True, False or Unknown, not {status!r}")
    if not type:
        raise ValueError("a condition needs a type")
    if not _REASON.match(reason) or len(reason) > _MAX_REASON:
        raise ValueError(
            f"condition {type!r}: reason {reason!r} is not a CamelCase word "
            "(letters, digits, '_', ',' or ':', starting with a letter)"
        )
    if len(message) > _MAX_MESSAGE:
        message = message[: _MAX_MESSAGE - 3] + "..."
    if observed_generation is None:
        generation = (obj.get("metadata") or {}).get("generation")
        observed_generation = generation if isinstance(generation, int) else None
    status_field = obj.get("status")
    if not isinstance(status_field, dict):
        status_field = obj["status"] = {}
    conditions = status_field.get("conditions")
    if not isinstance(conditions, list):
        conditions = status_field["conditions"] = []
    wanted: JSON = {"type": type, "status": status, "reason": reason, "message": message}
    if observed_generation is not None:
        wanted["observedGeneration"] = observed_generation
    for current in conditions:
        if isinstance(current, dict) and current.get("type") == type:
            if current.get("status") != status or not current.get("lastTransitionTime"):
                wanted["lastTransitionTime"] = now or _now()
            else:
                wanted["lastTransitionTime"] = current["lastTransitionTime"]
            if current == wanted:
                return False
            current.clear()
            current.update(wanted)
            return True
    wanted["lastTransitionTime"] = now or _now()
    conditions.append(wanted)
    return True


def find_status_condition(obj: Mapping[str, Any], type: str) -> JSON | None:
    """Condition ``type`` of ``obj``, or ``None`` when it has none."""
    for condition in _conditions(obj):
        if isinstance(condition, dict) and condition.get("type") == type:
            return condition
    return None


def is_status_condition_true(obj: Mapping[str, Any], type: str) -> bool:
    """Whether condition ``type`` is present with status ``True`` (absent or Unknown is not)."""
    condition = find_status_condition(obj, type)
    return condition is not None and condition.get("status") == "True"


def remove_status_condition(obj: JSON, type: str) -> bool:
    """Drop condition ``type`` from ``obj``; ``True`` if it was there."""
    conditions = _conditions(obj)
    kept = [c for c in conditions if not (isinstance(c, dict) and c.get("type") == type)]
    if len(kept) == len(conditions):
        return False
    conditions[:] = kept
    return True
