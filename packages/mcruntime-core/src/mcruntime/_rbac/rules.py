"""Permissions merged into RBAC policy rules: deduplicated, grouped and sorted.

The same program must give the same YAML byte for byte, whatever order its
controllers were built in, so a diff of two generations shows only what
changed. Verbs of one resource are unioned; resources of one API group with
the same verbs share a rule; a namespaced grant that a cluster-wide one
already covers is dropped.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from .._base.permissions import Permission

PolicyRule = dict[str, Any]
Grants = dict[tuple[str, str], set[str]]
"""``(apiGroup, resource)`` -> verbs."""


def grants_of(permissions: Iterable[Permission]) -> dict[str | None, Grants]:
    """Verbs per (group, resource), by namespace (``None``: cluster-wide)."""
    scopes: dict[str | None, Grants] = {}
    for permission in permissions:
        grants = scopes.setdefault(permission.namespace, {})
        grants.setdefault((permission.kind.group, permission.rest_name), set()).update(permission.verbs)
    cluster_wide = scopes.get(None, {})
    for namespace, grants in scopes.items():
        if namespace is None:
            continue
        for key in list(grants):
            covered = cluster_wide.get(key, set())
            grants[key] = grants[key] - covered if "*" not in covered else set()
            if not grants[key]:
                del grants[key]
    return {namespace: grants for namespace, grants in scopes.items() if grants}


def policy_rules(grants: Grants) -> list[PolicyRule]:
    """One rule per (group, verbs), resources sorted; rules sorted by group, resources, verbs."""
    by_verbs: dict[tuple[str, tuple[str, ...]], list[str]] = {}
    for (group, resource), verbs in grants.items():
        wanted = ("*",) if "*" in verbs else tuple(sorted(verbs))
        by_verbs.setdefault((group, wanted), []).append(resource)
    rules = [
        {"apiGroups": [group], "resources": sorted(resources), "verbs": list(verbs)}
        for (group, verbs), resources in by_verbs.items()
    ]
    rules.sort(key=lambda rule: (rule["apiGroups"], rule["resources"], rule["verbs"]))
    return rules
