"""``rbac_for(manager)``: the least-privilege RBAC of a built manager, as objects and YAML.

Kubebuilder asks for hand-written markers and trusts them; here the manager
already knows what it will do. Its controllers' wiring (``for_``, ``owns``,
``watches``, and ``writes``/``reads`` for what wiring cannot show), the
declarations made with :meth:`Manager.declare_rbac`, the leases of leader
election and sharding, and every provider, runnable or aware that has an
``rbac_rules()`` method are merged into one :class:`RBAC`: per role, a
ClusterRole for cluster-wide rules, a Role per namespace for namespaced ones,
and the bindings to the program's identity.

Two roles: ``hub`` is applied to the management cluster the manager runs in
(bound to its ServiceAccount); ``member`` is applied to every member cluster
(bound to the identity its credentials name, by default a ServiceAccount of the
same name and namespace, which the member YAML creates).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import yaml

from .._base.names import name_problem
from .._base.permissions import ROLES, Permission, Role
from .._coordination.lease import LEASE
from .._coordination.sharding import ShardedCoordinator
from .._fleet.protocols import DeclaresPermissions
from .rules import PolicyRule, grants_of, policy_rules

if TYPE_CHECKING:
    from .._manager.manager import Manager

_SUBJECT_KINDS = ("ServiceAccount", "User", "Group")
RBAC_GROUP = "rbac.authorization.k8s.io"

_HEADERS: Mapping[Role, str] = {
    "hub": "Apply to the hub (management) cluster the manager runs in.",
    "member": "Apply to every member cluster; bind the identity its credentials use.",
}


def _check_name(label: str, value: str, *, subdomain: bool) -> None:
    problem = name_problem(value, subdomain=subdomain)
    if problem is not None:
        raise ValueError(f"rbac: {label} {value!r} {problem}")


@dataclass(frozen=True)
class Subject:
    """Who a role is bound to: a ServiceAccount (with its namespace), a User or a Group."""

    kind: str
    name: str
    namespace: str | None = None

    def __post_init__(self) -> None:
        if self.kind not in _SUBJECT_KINDS:
            raise ValueError(
                f"rbac: subject kind must be one of {', '.join(_SUBJECT_KINDS)}, not {self.kind!r}"
            )
        if not self.name:
            raise ValueError("rbac: a subject needs a name")
        if (self.kind == "ServiceAccount") != (self.namespace is not None):
            raise ValueError("rbac: a ServiceAccount subject needs a namespace, and only it has one")

    def as_json(self) -> dict[str, str]:
        """The subject as a binding's ``subjects`` entry."""
        if self.namespace is not None:
            return {"kind": self.kind, "name": self.name, "namespace": self.namespace}
        return {"kind": self.kind, "name": self.name, "apiGroup": RBAC_GROUP}


@dataclass(frozen=True)
class RBAC:
    """What a program needs, per role; :meth:`to_yaml` gives what ``kubectl apply`` takes.

    ``permissions`` are the sources (with the reason of each); the rules are
    merged from them deterministically, so the same program always gives the
    same YAML.
    """

    name: str
    subjects: Mapping[Role, Subject]
    permissions: tuple[Permission, ...] = field(default=())

    @property
    def roles(self) -> list[Role]:
        """The roles that need anything, hub first."""
        present = {permission.role for permission in self.permissions}
        return [role for role in ROLES if role in present]

    def rules(self, role: Role, namespace: str | None = None) -> list[PolicyRule]:
        """The merged rules of ``role``: cluster-wide (``namespace=None``) or of one namespace's Role."""
        scopes = grants_of(p for p in self.permissions if p.role == role)
        return policy_rules(scopes.get(namespace, {}))

    def namespaces(self, role: Role) -> list[str]:
        """The namespaces where ``role`` needs a Role (its namespaced grants)."""
        scopes = grants_of(p for p in self.permissions if p.role == role)
        return sorted(namespace for namespace in scopes if namespace is not None)

    def objects(self, role: Role | None = None) -> list[dict[str, Any]]:
        """The Kubernetes objects of one role (or of both, hub first), ready to apply."""
        found: list[dict[str, Any]] = []
        for each in [role] if role else self.roles:
            found.extend(self._objects(each))
        return found

    def _objects(self, role: Role) -> list[dict[str, Any]]:
        name = f"{self.name}-{role}"
        labels = {"app.kubernetes.io/name": self.name, "app.kubernetes.io/managed-by": "mcruntime"}
        subject = self.subjects[role]
        found: list[dict[str, Any]] = []
        if role == "member" and subject.namespace is not None:
            # The member identity lives in each member; the hub's is the Deployment's own. The
            # namespace is not labelled: a label-selected prune must never delete a shared one.
            found.append(_object("v1", "Namespace", subject.namespace, None, {}))
            found.append(_object("v1", "ServiceAccount", subject.name, subject.namespace, labels))
        cluster_rules = self.rules(role)
        if cluster_rules:
            found.append(
                {**_object(f"{RBAC_GROUP}/v1", "ClusterRole", name, None, labels), "rules": cluster_rules}
            )
            found.append(_binding("ClusterRoleBinding", "ClusterRole", name, None, labels, subject))
        for namespace in self.namespaces(role):
            role_object = _object(f"{RBAC_GROUP}/v1", "Role", name, namespace, labels)
            found.append({**role_object, "rules": self.rules(role, namespace)})
            found.append(_binding("RoleBinding", "Role", name, namespace, labels, subject))
        return found

    def explain(self, role: Role | None = None) -> str:
        """A line per permission of ``role`` (or both), before merging: role, scope, verbs, resource, why."""
        lines = []
        for permission in self.permissions:
            if role is not None and permission.role != role:
                continue
            scope = permission.namespace or "cluster-wide"
            group = permission.kind.group or "core"
            verbs = ",".join(permission.verbs)
            reason = f"  # {permission.reason}" if permission.reason else ""
            named = f" named {','.join(permission.resource_names)}" if permission.resource_names else ""
            lines.append(f"{permission.role} {scope} {verbs} {permission.rest_name}{named} ({group}){reason}")
        return "\n".join(sorted(set(lines))) + ("\n" if lines else "")

    def to_yaml(self, role: Role | None = None) -> str:
        """Multi-document YAML of one role (or both, each under a comment saying where it goes)."""
        sections: list[str] = []
        for each in [role] if role else self.roles:
            documents = [yaml.safe_dump(obj, sort_keys=False) for obj in self._objects(each)]
            header = f"# {each}: {_HEADERS[each]}\n"
            sections.append(header + "---\n".join(documents))
        return "---\n".join(sections)


def _object(
    api_version: str, kind: str, name: str, namespace: str | None, labels: Mapping[str, str]
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if namespace is not None:
        meta["namespace"] = namespace
    if labels:
        meta["labels"] = dict(labels)
    return {"apiVersion": api_version, "kind": kind, "metadata": meta}


def _binding(
    kind: str, role_kind: str, name: str, namespace: str | None, labels: Mapping[str, str], subject: Subject
) -> dict[str, Any]:
    return {
        **_object(f"{RBAC_GROUP}/v1", kind, name, namespace, labels),
        "roleRef": {"apiGroup": RBAC_GROUP, "kind": role_kind, "name": name},
        "subjects": [subject.as_json()],
    }


def _lease_permissions(manager: Manager) -> list[Permission]:
    found: list[Permission] = []
    if manager.elector is not None:
        config = manager.elector.config
        why = f"leader election (Lease {config.namespace}/{config.name})"
        found.append(
            Permission(LEASE, ("get", "create", "update"), "hub", namespace=config.namespace, reason=why)
        )
    if isinstance(manager.coordinator, ShardedCoordinator):
        sharding = manager.coordinator.config
        why = f"sharding (group {sharding.name}: peer and fencing Leases)"
        verbs = ("get", "list", "watch", "create", "update", "delete")
        found.append(Permission(LEASE, verbs, "hub", namespace=sharding.namespace, reason=why))
    return found


def _declared_by(components: Iterable[object]) -> list[Permission]:
    found: list[Permission] = []
    for component in components:
        if isinstance(component, DeclaresPermissions):
            found.extend(component.rbac_rules())
    return found


def _webhook_server(manager: Manager) -> list[object]:
    """The manager's webhook server when it has handlers (it joins the components only at start)."""
    server = manager.webhook
    return [server] if server.has_handlers else []


def rbac_for(
    manager: Manager,
    *,
    name: str,
    namespace: str,
    service_account: str | None = None,
    member_subject: Subject | None = None,
) -> RBAC:
    """The RBAC ``manager`` needs, bound to ServiceAccount ``service_account`` in ``namespace``.

    Call it on a built manager (controllers complete, not started). ``name``
    names the ClusterRoles, Roles and bindings (``<name>-hub``,
    ``<name>-member``); ``service_account`` defaults to ``name``.
    ``member_subject`` is who the member role is bound to: by default a
    ServiceAccount of the same name and namespace in each member (its token
    is what the member's kubeconfig Secret would carry).
    """
    account = name if service_account is None else service_account
    _check_name("name", name, subdomain=True)
    _check_name("namespace", namespace, subdomain=False)
    _check_name("service_account", account, subdomain=True)
    hub = Subject("ServiceAccount", account, namespace)
    permissions = [
        *manager.permissions,
        *_lease_permissions(manager),
        *_declared_by([manager.provider, *manager.components(), *_webhook_server(manager)]),
    ]
    return RBAC(name, {"hub": hub, "member": member_subject or hub}, tuple(permissions))


def render_rbac_yaml(manager: Manager, name: str, namespace: str, service_account: str) -> str:
    """The YAML ``mcruntime rbac`` prints: both roles, bound to ``namespace``/``service_account``."""
    return rbac_for(manager, name=name, namespace=namespace, service_account=service_account).to_yaml()
