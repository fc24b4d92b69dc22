"""The namespace provider: each (selected) namespace of one host cluster is a cluster of its own.

The provider opens one :class:`~mcruntime.Cluster` to the host and watches its
Namespaces; every namespace that is selected and not terminating is engaged
as a :class:`~mcruntime.NamespacedCluster` named after it. All of them share
the host's connection and its one informer per kind.

Why not a :class:`~mcruntime.provider.ClusterSetProvider`: a ClusterSet builds
one Cluster, with its own connection, probe and informers, per config; here
every cluster is a view of the same connection, so there is nothing for a
ClusterSet to build, compare or replace (a namespace's "config" never
changes). The provider implements the :class:`~mcruntime.Provider` protocol
directly, in the few lines that remain.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import mcruntime as mcr
from mcruntime.cache import IndexFunc
from mcruntime.client import HealthState
from mcruntime.provider import Aware, ClusterPhase, ClusterStatus, SourceStatus

log = logging.getLogger("mcruntime.provider.namespace")

NAMESPACE = mcr.Kind("v1", "Namespace")


def _selected(namespace: dict[str, Any]) -> bool:
    """A namespace is a cluster unless it is going away (deleting, or already terminating)."""
    meta = namespace.get("metadata") or {}
    status = namespace.get("status") or {}
    return not meta.get("deletionTimestamp") and status.get("phase") != "Terminating"


def _forbidden(missing: tuple[str, ...]) -> str:
    """The core's wording for a cluster's refusals: its ``/readyz`` lines say the same."""
    return "forbidden by RBAC: " + "; ".join(missing)


@dataclass
class _Engaged:
    cluster: mcr.NamespacedCluster
    since: float
    version: str | None


class NamespaceProvider:
    """Every selected namespace of one host cluster, engaged as a cluster named after it.

    Namespaces created (or labelled to match ``label_selector``) while the
    provider runs are engaged; deleted, terminating or de-labelled ones are
    disengaged. Each cluster's client and cache are pinned to its namespace
    (see :class:`~mcruntime.NamespacedCluster`), so a reconciler written for
    whole clusters runs per tenant unchanged, while the host keeps one
    connection and one informer per kind for all of them.

    ``config`` reaches the host; its user needs cluster-wide ``list`` and
    ``watch`` on Namespaces and on every kind the controllers read (the shared
    informers are cluster-wide, including namespaces that are not selected).
    ``options`` tune the host (``cache_namespace`` must stay unset: the cache
    is already split by namespace); ``host_name`` names it in logs and errors.

    ``scoped_informers``: with ``False`` (the default) every namespace's
    cluster reads the host's one informer per kind, which lists and watches
    *all* namespaces, selected or not (a thousand tenants cost one watch per
    kind). With ``True`` each cluster has informers of its own for its
    namespace, so the process holds only the selected namespaces' objects, at
    one watch per kind per namespace: the choice when ``label_selector``
    selects a few namespaces of many.
    """

    def __init__(
        self,
        config: mcr.ClusterConfig,
        *,
        label_selector: str | Mapping[str, str] | None = None,
        options: mcr.ClusterOptions | None = None,
        host_name: str = "namespace-host",
        scoped_informers: bool = False,
    ) -> None:
        options = options or mcr.ClusterOptions()
        if options.cache_namespace is not None:
            raise ValueError(
                f"NamespaceProvider for {host_name!r}: ClusterOptions.cache_namespace must be None "
                f"(got {options.cache_namespace!r}); each namespace's cluster is scoped already"
            )
        self.config = config
        self.options: mcr.ClusterOptions = options
        self.label_selector = label_selector
        self.host_name = host_name
        self.scoped_informers = scoped_informers
        """Whether each namespace's cluster lists and watches its namespace only (see the class)."""
        self._host: mcr.Cluster | None = None
        self._engaged: dict[str, _Engaged] = {}
        self._indexes: dict[tuple[mcr.Kind, str], IndexFunc] = {}
        self._running = False

    def rbac_rules(self) -> list[mcr.Permission]:
        """Watch Namespaces on the host, in the member role: the one applied where the clusters live.

        The host is the cluster every engaged namespace lives in, so it gets
        the member role whether or not it is also the manager's own cluster
        (the hub role goes to that one, which may be another).
        """
        return [
            mcr.Permission(
                NAMESPACE,
                ("get", "list", "watch"),
                "member",
                reason="NamespaceProvider: the namespaces it engages",
            )
        ]

    def __repr__(self) -> str:
        return f"<NamespaceProvider host={self.host_name!r} clusters={len(self._engaged)}>"

    @property
    def host(self) -> mcr.Cluster | None:
        """The one cluster to the host API server while the provider runs (``None`` otherwise)."""
        return self._host

    def names(self) -> list[str]:
        """The engaged namespaces' names, sorted."""
        return sorted(self._engaged)

    async def get(self, name: str) -> mcr.Cluster:
        """The engaged cluster of namespace ``name``; raises :class:`~mcruntime.ClusterNotFound`."""
        engaged = self._engaged.get(name)
        if engaged is None:
            raise mcr.ClusterNotFound(name, f"no namespace {name!r} is engaged from host {self.host_name!r}")
        return engaged.cluster

    async def index_field(self, kind: mcr.Kind, name: str, extract: IndexFunc) -> None:
        """Index ``kind`` on the host (shared informers) or in every namespace's cluster (scoped ones)."""
        self._indexes[(kind, name)] = extract
        if self._host is not None:
            self._host.cache.index_field(kind, name, extract)
        for engaged in self._engaged.values():
            if self.scoped_informers:
                engaged.cluster.cache.index_field(kind, name, extract)

    def statuses(self) -> Mapping[str, ClusterStatus]:
        """Frozen snapshots of every engaged namespace; the phase is the host's health.

        The host's one health record decides, read as ``/readyz`` reads it
        for each namespace's cluster (they share the record): unhealthy,
        a failing loop, or requests refused by RBAC (a relist of a revoked
        watch, say) make every namespace unhealthy, naming what is refused.
        """
        host = self._host
        health = host.health if host is not None else None
        result: dict[str, ClusterStatus] = {}
        for name, engaged in sorted(self._engaged.items()):
            source = SourceStatus(
                kind="Namespace", name=name, cluster=name, engaged=True, version=engaged.version
            )
            phase, since, error = ClusterPhase.ENGAGING, engaged.since, None
            missing: tuple[str, ...] = ()
            if health is not None:
                missing = health.missing_permissions
                failing = engaged.cluster.failing_loops()
                if health.state is HealthState.UNHEALTHY:
                    phase, since, error = ClusterPhase.UNHEALTHY, health.since, health.reason
                elif health.state is HealthState.UNKNOWN:
                    pass
                elif failing:
                    phase, since, error = ClusterPhase.UNHEALTHY, health.since, "; ".join(failing)
                elif missing:
                    phase, since, error = ClusterPhase.UNHEALTHY, health.since, _forbidden(missing)
                else:
                    phase, since = ClusterPhase.READY, max(health.since, engaged.since)
            result[name] = ClusterStatus(
                name, phase, since, error, engagements=1, source=source, missing_permissions=missing
            )
        if host is not None and not result:
            trouble = self._host_trouble(host)
            if trouble is not None:
                result[trouble.name] = trouble
        return result

    def _host_trouble(self, host: mcr.Cluster) -> ClusterStatus | None:
        """The host itself, while it is failing and no namespace is engaged to say so.

        An engaged namespace carries the host's health (its line in ``/readyz``
        names a refused list or a hung server). With none engaged, a host whose
        namespaces cannot be read would otherwise fail in the log alone: a 403
        on ``list namespaces`` left ``/readyz`` and ``statuses()`` empty. It is
        reported under ``host:NAME`` (a name no namespace can have) as
        unhealthy, which counts against readiness: with its one source failing,
        the provider engages nothing, and a replica that does nothing must not
        pass its rollout as ready.
        """
        health = host.health
        if health.missing_permissions:
            error = _forbidden(health.missing_permissions)
        elif health.state is HealthState.UNHEALTHY:
            error = health.reason or "unhealthy"
        else:
            return None
        error = f"the host's namespaces cannot be read: {error}"
        name = f"host:{self.host_name}"
        source = SourceStatus(kind="host cluster", name=self.host_name, error=error)
        return ClusterStatus(
            name,
            ClusterPhase.UNHEALTHY,
            health.since,
            error,
            engagements=0,
            source=source,
            missing_permissions=health.missing_permissions,
        )

    async def run(self, aware: Aware) -> None:
        """Connect to the host, follow its Namespaces and engage them with ``aware`` until cancelled."""
        if self._running:
            raise RuntimeError(f"{self!r} is already running")
        self._running = True
        host = mcr.Cluster(self.host_name, self.config, self.options)
        self._host = host
        changed = asyncio.Event()

        def poke(*_args: object) -> None:
            changed.set()

        registration = None
        try:
            await host.start()
            for (kind, index_name), extract in self._indexes.items():
                host.cache.index_field(kind, index_name, extract)
            informer = host.cache.informer(NAMESPACE, label_selector=self.label_selector)
            registration = informer.add_handler(mcr.ResourceEventHandler(poke, poke, poke))
            while True:
                await changed.wait()
                changed.clear()
                await self._sync(host, informer.list(), aware)
        finally:
            if registration is not None:
                registration.remove()
            engaged = list(self._engaged.values())
            self._engaged.clear()
            await asyncio.gather(*(entry.cluster.stop() for entry in engaged), return_exceptions=True)
            await host.stop()
            self._host = None
            self._running = False

    async def _sync(self, host: mcr.Cluster, namespaces: list[dict[str, Any]], aware: Aware) -> None:
        """Make the engaged set equal the selected, live namespaces."""
        desired: dict[str, str | None] = {}
        for namespace in namespaces:
            meta = namespace.get("metadata") or {}
            if _selected(namespace) and meta.get("name"):
                desired[str(meta["name"])] = meta.get("resourceVersion")
        for name in [name for name in self._engaged if name not in desired]:
            log.info("namespace %r of %r is gone or deselected; disengaging", name, self.host_name)
            await self._engaged[name].cluster.stop()
            del self._engaged[name]  # after the stop: a status gone means a cluster fully released
        for name, version in desired.items():
            current = self._engaged.get(name)
            if current is not None:
                current.version = version
                continue
            cluster = mcr.NamespacedCluster(host, name, shared_informers=not self.scoped_informers)
            if self.scoped_informers:
                for (kind, index_name), extract in self._indexes.items():
                    cluster.cache.index_field(kind, index_name, extract)
            await cluster.start()
            self._engaged[name] = _Engaged(cluster, time.time(), version)
            try:
                await aware.engage(name, cluster)
            except Exception:
                log.exception("namespace %r of %r: engaging failed", name, self.host_name)
