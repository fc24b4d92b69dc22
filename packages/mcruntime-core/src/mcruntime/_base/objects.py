"""JSON-shaped objects: conversion from kubernetes-asyncio models, copying, keys.

mcruntime keeps objects as the dicts the API server sends: decoding a Pod into
generated model classes costs about twenty times a plain JSON decode, and a fleet
cache holds hundreds of thousands of objects. Model objects are accepted at the
edges (writes) and converted here.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from typing import Any

JSON = dict[str, Any]


def to_json_shape(value: Any) -> Any:
    """A kubernetes-asyncio model (or any nesting of them) as plain JSON data.

    Generated models carry ``openapi_types`` (Python attribute names) and
    ``attribute_map`` (their JSON names); unset attributes are dropped, as the
    server would drop them.
    """
    if value is None or isinstance(value, str | int | float | bool):
        return value
    if isinstance(value, Mapping):
        return {str(key): to_json_shape(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [to_json_shape(item) for item in value]
    if isinstance(value, datetime.datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=datetime.UTC)
        # Whole seconds as metav1.Time is written; otherwise the microseconds that
        # metav1.MicroTime requires (a Lease's renewTime) and metav1.Time accepts.
        layout = "%Y-%m-%dT%H:%M:%S.%fZ" if value.microsecond else "%Y-%m-%dT%H:%M:%SZ"
        return value.astimezone(datetime.UTC).strftime(layout)
    if isinstance(value, datetime.date):
        return value.isoformat()
    attribute_map = getattr(value, "attribute_map", None)
    openapi_types = getattr(value, "openapi_types", None)
    if isinstance(attribute_map, dict) and isinstance(openapi_types, dict):
        shaped: JSON = {}
        for attribute in openapi_types:
            item = getattr(value, attribute)
            if item is not None:
                shaped[attribute_map[attribute]] = to_json_shape(item)
        return shaped
    raise TypeError(f"cannot send a {type(value).__name__} to the API server; use a dict or a model")


def json_copy(value: Any) -> Any:
    """A deep copy of JSON data, several times faster than ``copy.deepcopy``.

    The cache hands out copies so that a caller mutating what it read can never
    corrupt the shared store; this is the cost of that guarantee, kept small.
    """
    if isinstance(value, dict):
        return {
            key: json_copy(item) if isinstance(item, _CONTAINERS) else item for key, item in value.items()
        }
    if isinstance(value, list):
        return [json_copy(item) if isinstance(item, _CONTAINERS) else item for item in value]
    return value


_CONTAINERS = (dict, list)  # a tuple, built once: ``dict | list`` would build a union on every item


def object_key(obj: Mapping[str, Any]) -> str:
    """``namespace/name`` for namespaced objects, ``name`` for cluster-scoped ones."""
    metadata = obj.get("metadata") or {}
    namespace = metadata.get("namespace")
    name = metadata.get("name", "")
    return f"{namespace}/{name}" if namespace else str(name)


def metadata(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    """The object's metadata (empty when absent)."""
    value = obj.get("metadata")
    if isinstance(value, dict):  # what JSON decodes to: no ABC check (three per watch event)
        return value
    return value if isinstance(value, Mapping) else {}
