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
Grants = dict[tuple[str, str, tuple[str, ...]], set[str]]
"""``(apiGroup, resource, resourceNames)`` -> verbs; no names: every object."""


def grants_of(permissions: Iterable[Permission]) -> dict[str | None, Grants]:
    """Verbs per (group, resource, names), by namespace (``None``: cluster-wide)."""
    scopes: dict[str | None, Grants] = {}
    for permission in permissions:
        grants = scopes.setdefault(permission.namespace, {})
        key = (permission.kind.group, permission.rest_name, permission.resource_names)
        grants.setdefault(key, set()).update(permission.verbs)
    cluster_wide = scopes.get(None, {})
    for namespace, grants in scopes.items():
        for key in list(grants):
            group, resource, names = key
            # What a grant on every object already gives: here, or cluster-wide.
            covered = set(cluster_wide.get((group, resource, ()), set()))
            if names:
                covered |= grants.get((group, resource, ()), set())
            elif namespace is None:
                continue
            grants[key] = grants[key] - covered if "*" not in covered else set()
            if not grants[key]:
                del grants[key]
    return {namespace: grants for namespace, grants in scopes.items() if grants}


def policy_rules(grants: Grants) -> list[PolicyRule]:
    """One rule per (group, verbs, names), resources sorted; rules sorted by group, resources, verbs."""
    by_verbs: dict[tuple[str, tuple[str, ...], tuple[str, ...]], list[str]] = {}
    for (group, resource, names), verbs in grants.items():
        wanted = ("*",) if "*" in verbs else tuple(sorted(verbs))
        by_verbs.setdefault((group, wanted, names), []).append(resource)
    rules: list[PolicyRule] = []
    for (group, allowed, names), resources in by_verbs.items():
        rule: PolicyRule = {"apiGroups": [group], "resources": sorted(resources)}
        if names:
            rule["resourceNames"] = list(names)
        rule["verbs"] = list(allowed)
        rules.append(rule)
    rules.sort(key=lambda r: (r["apiGroups"], r["resources"], r.get("resourceNames", []), r["verbs"]))
    return rules
