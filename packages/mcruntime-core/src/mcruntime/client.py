"""The client's data types, for code that annotates or builds what :class:`~mcruntime.Client` handles.

Calls go through ``cluster.client``; these name what flows through it: a
watch's events, a list's result, a patch's type, a write's field validation, a resolved resource, a label
selector, an object's ``namespace/name`` key, a fleet-wide call's result, and a
cluster's health as its client sees it.
"""

from __future__ import annotations

from ._base.kind import Resource
from ._base.labels import LabelSelector
from ._base.objects import object_key
from ._client.client import ObjectList, PatchType, WatchEvent
from ._client.field_validation import FieldValidation
from ._client.health import ClusterHealth, HealthState
from ._fleet.clients import FleetResult

__all__ = [
    "ClusterHealth",
    "FieldValidation",
    "FleetResult",
    "HealthState",
    "LabelSelector",
    "ObjectList",
    "PatchType",
    "Resource",
    "WatchEvent",
    "object_key",
]
