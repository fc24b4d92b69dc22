"""Missing permissions of one cluster: every request refused with 403, until it succeeds.

A watch the RBAC does not allow is otherwise a quiet stall: the informer
retries with backoff forever and the cache never syncs. Each 403 is recorded
here by verb, resource and namespace (logged once when it appears, once when it
goes), and the record feeds ``statuses()`` and ``/readyz`` through the
cluster's health snapshot. The same request succeeding later (the rule was
granted; informers retry on their own) clears it without a restart. A denial
nothing repeats (a write of an object since deleted) is forgotten after
``ttl`` seconds, so it cannot hold a cluster unready forever.

Event writes are best-effort (a recorder drops what it cannot write, and the
controller does its job regardless), so their refusals are kept apart
(:meth:`Denials.refused_events`): shown in ``/readyz`` and ``statuses()``,
never counted against the cluster's health or readiness.

Only the authorizer's refusals count: admission plugins (a namespace being
terminated) and webhooks answer 403 too, about the object, not the identity.
"""

from __future__ import annotations

import logging
import re
import time
from dataclasses import dataclass
from typing import Any

from .._base.kind import Resource

log = logging.getLogger("mcruntime.permissions")

DEFAULT_TTL = 600.0
_Key = tuple[str, str, str, str | None]
# The authorizer's wording (`User "system:serviceaccount:ops:app" cannot list resource ...`);
# admission plugins and webhooks also answer 403, about the object rather than the identity.
_AUTHORIZATION = re.compile(r'User "[^"]*" cannot ')


def refused_by_authorization(body: Any) -> bool:
    """Whether a 403's Status says the identity lacks a permission (RBAC), not that admission refused."""
    if isinstance(body, dict):
        message = body.get("message")
        return isinstance(message, str) and _AUTHORIZATION.search(message) is not None
    return False


def best_effort(group: str, plural: str) -> bool:
    """Whether a write of this resource is best-effort: Events (``events.k8s.io`` or core), nothing else."""
    return plural == "events" and group in ("", "events.k8s.io")


def verb_of(method: str, name: str | None) -> str:
    """The RBAC verb of a request: ``GET`` of a collection is ``list``, of one object ``get``, and so on."""
    if method == "GET":
        return "get" if name else "list"
    if method == "DELETE":
        return "delete" if name else "deletecollection"
    return {"POST": "create", "PUT": "update", "PATCH": "patch"}.get(method, method.lower())


@dataclass
class _Denial:
    text: str
    last_seen: float


class Denials:
    """The 403s one cluster's requests got, by (verb, group, resource, namespace)."""

    def __init__(self, cluster: str, *, ttl: float = DEFAULT_TTL) -> None:
        self.cluster = cluster
        self.ttl = ttl
        self._denied: dict[_Key, _Denial] = {}

    @staticmethod
    def _key(verb: str, resource: Resource, subresource: str | None, namespace: str | None) -> _Key:
        name = f"{resource.plural}/{subresource}" if subresource else resource.plural
        return (verb, resource.group, name, namespace if resource.namespaced else None)

    def denied(
        self, verb: str, resource: Resource, namespace: str | None, *, subresource: str | None = None
    ) -> None:
        """A request was refused with 403; logged the first time only."""
        key = self._key(verb, resource, subresource, namespace)
        found = self._denied.get(key)
        if found is not None:
            found.last_seen = time.monotonic()
            return
        verb, group, name, scope = key
        where = f"in namespace {scope!r}" if scope else "cluster-wide"
        qualified = f"{name}.{group}" if group else name
        text = f"cannot {verb} {resource.kind} ({qualified}) {where}"
        self._denied[key] = _Denial(text, time.monotonic())
        if best_effort(group, name):
            log.warning(
                "cluster %r: forbidden: %s; events there are dropped until RBAC allows it "
                "(best-effort: shown in /readyz, not counted)",
                self.cluster,
                text,
            )
            return
        log.warning(
            "cluster %r: forbidden: %s; retrying with backoff until RBAC allows it", self.cluster, text
        )

    def allowed(
        self, verb: str, resource: Resource, namespace: str | None, *, subresource: str | None = None
    ) -> None:
        """A request succeeded: a denial of the same request (or narrower, for a cluster-wide one) is over."""
        if not self._denied:
            return
        key = self._key(verb, resource, subresource, namespace)
        cleared = [key] if key in self._denied else []
        if key[3] is None:  # a cluster-wide success covers every namespace
            cleared = [other for other in self._denied if other[:3] == key[:3]]
        for other in cleared:
            denial = self._denied.pop(other)
            log.info("cluster %r: allowed again: %s", self.cluster, denial.text.removeprefix("cannot "))

    def describe(self) -> tuple[str, ...]:
        """What is denied now and counts (every refusal but an Event's), sorted; stale denials dropped."""
        return self._current(counted=True)

    def refused_events(self) -> tuple[str, ...]:
        """The Event writes denied now, sorted: shown, never counted against the cluster."""
        return self._current(counted=False)

    def _current(self, *, counted: bool) -> tuple[str, ...]:
        if not self._denied:
            return ()
        horizon = time.monotonic() - self.ttl
        for key in [key for key, denial in self._denied.items() if denial.last_seen < horizon]:
            del self._denied[key]
        return tuple(
            sorted(
                denial.text
                for (_verb, group, name, _scope), denial in self._denied.items()
                if best_effort(group, name) != counted
            )
        )
