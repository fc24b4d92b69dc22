"""Permissions a program needs: one kind, some verbs, in the hub or in the members.

A controller's RBAC is mostly visible in its wiring (what it watches, owns and
reconciles); what is not (a Job created in every member, a ConfigMap read by
name) is declared next to that wiring as a :class:`Permission`. Providers,
runnables and awares list what they need the same way (an optional
``rbac_rules()`` method). ``mcruntime.rbac_for`` turns them all into
ClusterRoles, Roles and bindings.

Roles are where a permission applies: ``"hub"`` is the manager's local
cluster (where leases, provider Secrets and Cluster objects live), ``"member"``
is every cluster a provider engages.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Literal

from .kind import Kind

Role = Literal["hub", "member"]
ROLES: tuple[Role, ...] = ("hub", "member")

READ: tuple[str, ...] = ("get", "list", "watch")
"""What a watch or a cache read needs."""
WRITE: tuple[str, ...] = ("create", "update", "patch", "delete")
"""What owning a kind needs: create, update, patch and delete its objects."""

_VERB = re.compile(r"^(\*|[a-z]+)$")
_RESOURCE = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")

# Kinds whose plural is not the regular English one (the API server's REST names).
_IRREGULAR = {"Endpoints": "endpoints", "PodMetrics": "pods", "NodeMetrics": "nodes"}


def plural_of(kind: Kind) -> str:
    """The REST name the API server most likely serves ``kind`` under (``Ingress`` -> ``ingresses``).

    Built-in kinds and CRDs that keep the default plural follow the English
    rule; a CRD with a custom plural needs ``Permission(resource=...)``.
    """
    name = _IRREGULAR.get(kind.kind)
    if name is not None:
        return name
    lower = kind.kind.lower()
    if lower.endswith(("s", "x", "z", "ch", "sh")):
        return f"{lower}es"
    if lower.endswith("y") and len(lower) > 1 and lower[-2] not in "aeiou":
        return f"{lower[:-1]}ies"
    return f"{lower}s"


@dataclass(frozen=True)
class Permission:
    """Verbs on one kind (or one of its subresources) in one role, cluster-wide or in one namespace.

    ``namespace`` makes it a Role in that namespace instead of a ClusterRole
    rule (leases in the leader-election namespace, Secrets a provider reads).
    ``resource`` overrides the REST plural derived from the kind, for CRDs
    whose plural is not the English one. ``resource_names`` narrows it to
    those objects (RBAC's ``resourceNames``: it limits get, update, patch and
    delete, never create, list or watch). ``reason`` says, for people reading
    the generated YAML, why the rule exists.
    """

    kind: Kind
    verbs: tuple[str, ...]
    role: Role = "hub"
    namespace: str | None = None
    subresource: str | None = None
    resource: str | None = None
    reason: str = field(default="", compare=False)
    resource_names: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        verbs: object = self.verbs  # a str passes as tuple[str, ...] for a caller without types
        if isinstance(verbs, str):
            raise TypeError(
                f"Permission({self.kind}): verbs is a tuple of verbs, not the string {self.verbs!r}"
            )
        if not self.verbs:
            raise ValueError(f"Permission({self.kind}): give at least one verb")
        for verb in self.verbs:
            if not _VERB.match(verb):
                raise ValueError(
                    f"Permission({self.kind}): {verb!r} is not a verb (lower-case letters, or '*')"
                )
        if self.role not in ROLES:
            raise ValueError(f"Permission({self.kind}): role must be 'hub' or 'member', not {self.role!r}")
        for label, value in (("resource", self.resource), ("subresource", self.subresource)):
            if value is not None and not _RESOURCE.match(value):
                raise ValueError(f"Permission({self.kind}): {label} {value!r} is not a REST resource name")
        if self.namespace is not None and not self.namespace:
            raise ValueError(f"Permission({self.kind}): namespace must be a name or None, not empty")
        names: object = self.resource_names
        if isinstance(names, str):
            raise TypeError(f"Permission({self.kind}): resource_names is a tuple of names, not {names!r}")
        if any(not isinstance(name, str) or not name for name in self.resource_names):
            raise ValueError(f"Permission({self.kind}): resource_names must be non-empty names")
        object.__setattr__(self, "verbs", tuple(sorted(set(self.verbs))))
        object.__setattr__(self, "resource_names", tuple(sorted(set(self.resource_names))))

    @property
    def rest_name(self) -> str:
        """``plural`` or ``plural/subresource``, as RBAC rules name resources."""
        plural = self.resource or plural_of(self.kind)
        return f"{plural}/{self.subresource}" if self.subresource else plural
