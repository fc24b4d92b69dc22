"""What a watching provider keeps of the objects it reads: one Secret key, and each object's version.

A provider that watches Secrets on a hub holds every Secret of a namespace in
its informer; keeping only the one key it reads saves memory and keeps other
keys' secrets out of the process. The resourceVersion is what tells a pass
which objects changed since it last parsed them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from .._base.objects import JSON


def resource_version(obj: Mapping[str, Any]) -> str:
    """The object's ``metadata.resourceVersion`` (``""`` when absent): what changes with every write."""
    return str((obj.get("metadata") or {}).get("resourceVersion", ""))


def secret_key_only(key: str) -> Callable[[JSON], JSON]:
    """An informer transform keeping a Secret's name, namespace, resourceVersion and data ``key`` only."""
    kept = ("name", "namespace", "resourceVersion")

    def slim(secret: JSON) -> JSON:
        metadata = secret.get("metadata") or {}
        data = secret.get("data") or {}
        return {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {field: metadata[field] for field in kept if field in metadata},
            "data": {key: data[key]} if key in data else {},
        }

    slim.__name__ = f"secret_key_only({key!r})"
    return slim
