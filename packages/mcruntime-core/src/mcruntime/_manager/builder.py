"""The builder: the fluent way to wire a controller, checked when it is built.

``controller_managed_by(mgr).for_(KIND).owns(CHILD).complete(reconcile)`` reads
like controller-runtime's builder. Mistakes (no ``for_`` and no ``watches``, a
second ``for_``, ``owns`` without ``for_``, a duplicate controller name) are
errors raised by ``complete`` that say what is wrong, not surprises at runtime.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from .._base.kind import Kind
from .._base.permissions import READ, WRITE, Permission, Role
from .._control.controller import DEFAULT_KEYS_PER_TURN, DEFAULT_MAX_TOTAL_RECONCILES, Controller
from .._control.handler import EventHandler, enqueue_for_object, enqueue_for_owner
from .._control.predicate import ObjectEvent, Predicate
from .._control.ratelimit import RateLimiter
from .._control.source import ChannelSource, ClusterSelection, KindSource
from .._fleet.cluster import ClusterOptions
from .._reconcile.request import ReconcileFunction, Reconciler, Request, as_reconcile_function

if TYPE_CHECKING:
    from .manager import Manager

_NAME = re.compile(r"^[a-z0-9]([-a-z0-9_.]*[a-z0-9])?$")


class BuilderError(ValueError):
    """The controller's wiring is wrong; the message says how."""


@dataclass
class _Declared:
    kind: Kind
    verbs: tuple[str, ...]
    clusters: ClusterSelection | None
    subresource: str | None
    namespace: str | None
    resource: str | None


@dataclass
class _Owns:
    kind: Kind
    only_controller: bool
    predicates: tuple[Predicate, ...]
    clusters: ClusterSelection | None
    metadata_only: bool
    optional: bool = False


class Builder:
    """Collects a controller's wiring; :meth:`complete` builds it and adds it to the manager."""

    def __init__(self, manager: Manager) -> None:
        self._manager = manager
        self._name: str | None = None
        self._for: KindSource | None = None
        self._owns: list[_Owns] = []
        self._watches: list[KindSource | ChannelSource] = []
        self._filters: tuple[Predicate, ...] = ()
        self._declared: list[_Declared] = []
        # Defaults come from the manager's MCRUNTIME_* settings when it was built from them.
        settings = getattr(manager, "settings", None)
        self._max_concurrent: int = settings.max_concurrent_reconciles if settings else 1
        self._max_total: int = settings.max_total_reconciles if settings else DEFAULT_MAX_TOTAL_RECONCILES
        self._keys_per_turn: int = settings.keys_per_turn if settings else DEFAULT_KEYS_PER_TURN
        self._rate_limiter: RateLimiter | None = None
        self._cache_sync_timeout: float = settings.cache_sync_timeout if settings else 60.0
        self._problems: list[str] = []

    def named(self, name: str) -> Builder:
        """Name the controller (defaults to the lower-cased kind of ``for_``)."""
        self._name = name
        return self

    def for_(
        self,
        kind: Kind,
        *,
        predicates: tuple[Predicate, ...] | list[Predicate] = (),
        clusters: ClusterSelection | None = None,
        namespace: str | None = None,
        label_selector: str | Mapping[str, str] | None = None,
        metadata_only: bool = False,
        optional: bool = False,
    ) -> Builder:
        """The kind this controller reconciles: each event enqueues the object itself.

        ``namespace`` and ``label_selector`` filter the events this controller
        sees; what the cache holds is set by ``ClusterOptions.cache``.
        ``metadata_only`` watches the kind's metadata view; the reconciler then
        reads it with ``cache.get(..., metadata_only=True)``. ``optional`` is for
        a fleet that differs by design (a CRD on some members only): a cluster
        that serves no such kind counts as synced and healthy, and its objects
        arrive once the kind is installed there.
        """
        if self._for is not None:
            self._problems.append(
                f"for_ was called twice ({self._for.kind} and {kind}); a controller has one"
            )
            return self
        self._for = KindSource(
            kind,
            enqueue_for_object(),
            tuple(predicates),
            clusters or ClusterSelection(),
            namespace,
            label_selector,
            metadata_only,
            optional,
        )
        return self

    def owns(
        self,
        kind: Kind,
        *,
        only_controller: bool = True,
        predicates: tuple[Predicate, ...] | list[Predicate] = (),
        clusters: ClusterSelection | None = None,
        metadata_only: bool = False,
        optional: bool = False,
    ) -> Builder:
        """Children of the ``for_`` kind: their events enqueue their owner (same cluster).

        Owner references are metadata, so ``metadata_only=True`` is enough to
        map children to owners, at a fraction of the memory. ``optional``: some
        clusters may serve no such kind, as in :meth:`for_`.
        """
        self._owns.append(_Owns(kind, only_controller, tuple(predicates), clusters, metadata_only, optional))
        return self

    def watches(
        self,
        kind: Kind,
        handler: EventHandler,
        *,
        predicates: tuple[Predicate, ...] | list[Predicate] = (),
        clusters: ClusterSelection | None = None,
        namespace: str | None = None,
        label_selector: str | Mapping[str, str] | None = None,
        metadata_only: bool = False,
        optional: bool = False,
    ) -> Builder:
        """Any other kind, with any handler: the way to map events across clusters.

        ``metadata_only`` watches the kind's metadata view (names, labels,
        annotations, owners), for kinds whose contents the controller never reads.
        ``optional``: some clusters may serve no such kind, as in :meth:`for_`.
        """
        self._watches.append(
            KindSource(
                kind,
                handler,
                tuple(predicates),
                clusters or ClusterSelection(),
                namespace,
                label_selector,
                metadata_only,
                optional,
            )
        )
        return self

    def watches_channel(
        self,
        channel: asyncio.Queue[Request | ObjectEvent],
        handler: EventHandler | None = None,
        *,
        predicates: tuple[Predicate, ...] | list[Predicate] = (),
    ) -> Builder:
        """Triggers from outside the clusters (put Requests, or Events for ``handler``)."""
        self._watches.append(ChannelSource(channel, handler or enqueue_for_object(), tuple(predicates)))
        return self

    def writes(
        self,
        kind: Kind,
        *verbs: str,
        clusters: ClusterSelection | None = None,
        subresource: str | None = None,
        namespace: str | None = None,
        resource: str | None = None,
    ) -> Builder:
        """Declare writes the wiring does not show, for the generated RBAC (``mcruntime rbac``).

        ``for_`` and ``owns`` already imply theirs. A controller that creates
        Jobs in every member from a hub object declares
        ``.writes(JOB, "create", "delete", clusters=mcr.PROVIDER_ONLY)``; it is
        the in-code counterpart of a kubebuilder RBAC marker, kept next to the
        wiring it belongs to. Nothing is enforced at run time. ``clusters``
        defaults to the manager's default (provider clusters when it has a
        provider); ``resource`` is the REST plural when it is not the English one.
        """
        if not verbs:
            self._problems.append(f"writes({kind}) names no verb; give at least one, such as 'create'")
            return self
        try:  # checked now, so complete() reports it with the rest
            Permission(kind, verbs, subresource=subresource, namespace=namespace, resource=resource)
        except (TypeError, ValueError) as error:
            self._problems.append(f"writes: {error}")
            return self
        self._declared.append(_Declared(kind, verbs, clusters, subresource, namespace, resource))
        return self

    def reads(
        self,
        kind: Kind,
        *,
        clusters: ClusterSelection | None = None,
        namespace: str | None = None,
        resource: str | None = None,
    ) -> Builder:
        """Declare cache reads of a kind the controller does not watch (get, list and watch)."""
        self._declared.append(_Declared(kind, READ, clusters, None, namespace, resource))
        return self

    def with_event_filter(self, *predicates: Predicate) -> Builder:
        """Predicates applied to every source of this controller."""
        self._filters = (*self._filters, *predicates)
        return self

    def with_options(
        self,
        *,
        max_concurrent_reconciles: int | None = None,
        max_total_reconciles: int | None = None,
        rate_limiter: RateLimiter | None = None,
        cache_sync_timeout: float | None = None,
        keys_per_turn: int | None = None,
    ) -> Builder:
        """Concurrency, retry pacing and how long a cluster's cache may take to sync.

        ``max_concurrent_reconciles`` is the width of each cluster's lane (how
        many reconciles of one cluster run at once), so a hung cluster can
        only ever hold that many; ``max_total_reconciles`` bounds them over all
        clusters together. When more clusters have work than there are free
        slots, each is handed up to ``keys_per_turn`` requests in a row: one
        API server's requests sent together cost it less than requests spread
        over every cluster, and no cluster waits more than that many per
        cluster ahead of it. Unset options take the manager's ``MCRUNTIME_*``
        settings when it was built with ``Manager.from_settings``.
        """
        if max_concurrent_reconciles is not None:
            if max_concurrent_reconciles < 1:
                self._problems.append(
                    f"max_concurrent_reconciles must be at least 1, not {max_concurrent_reconciles}"
                )
            self._max_concurrent = max_concurrent_reconciles
        if max_total_reconciles is not None:
            if max_total_reconciles < 1:
                self._problems.append(f"max_total_reconciles must be at least 1, not {max_total_reconciles}")
            self._max_total = max_total_reconciles
        if keys_per_turn is not None:
            if keys_per_turn < 1:
                self._problems.append(f"keys_per_turn must be at least 1, not {keys_per_turn}")
            self._keys_per_turn = keys_per_turn
        if rate_limiter is not None:
            self._rate_limiter = rate_limiter
        if cache_sync_timeout is not None:
            if not cache_sync_timeout > 0:
                self._problems.append(f"cache_sync_timeout must be above 0 seconds, not {cache_sync_timeout}")
            self._cache_sync_timeout = cache_sync_timeout
        return self

    def _controller_name(self) -> str:
        if self._name is not None:
            return self._name
        if self._for is not None:
            return self._for.kind.kind.lower()
        raise BuilderError("name the controller with named(...): it has no for_ kind to take a name from")

    def complete(self, reconciler: ReconcileFunction | Reconciler) -> Controller:
        """Build the controller, register it with the manager and return it."""
        problems = list(self._problems)
        if self._for is None and not self._watches:
            problems.append("nothing to watch: call for_(kind) or watches(...)")
        if self._owns and self._for is None:
            problems.append("owns(...) needs for_(kind): owned objects enqueue their for_ owner")
        try:
            name = self._controller_name()
        except BuilderError as error:
            problems.append(str(error))
            name = ""
        if name and not _NAME.match(name):
            problems.append(f"controller name {name!r} must be lower-case letters, digits, '-', '_' or '.'")
        if name in self._manager.controllers:
            problems.append(
                f"a controller named {name!r} already exists in this manager; name this one differently"
            )
        try:
            reconcile = as_reconcile_function(reconciler)
        except TypeError as error:
            problems.append(str(error))
        if problems:
            label = f"controller {name!r}" if name else "controller"
            raise BuilderError(f"{label}: " + "; ".join(problems))
        controller = Controller(
            name,
            reconcile,
            max_concurrent_reconciles=self._max_concurrent,
            max_total_reconciles=self._max_total,
            keys_per_turn=self._keys_per_turn,
            rate_limiter=self._rate_limiter,
            cache_sync_timeout=self._cache_sync_timeout,
            event_filters=self._filters,
            has_provider=self._manager.has_provider,
        )
        if self._for is not None:
            controller.watch(self._for)
            for owned in self._owns:
                controller.watch(
                    KindSource(
                        owned.kind,
                        enqueue_for_owner(self._for.kind, only_controller=owned.only_controller),
                        owned.predicates,
                        owned.clusters or replace(self._for.clusters),
                        metadata_only=owned.metadata_only,
                        optional=owned.optional,
                    )
                )
        for source in self._watches:
            controller.watch(source)
        self._manager.add(controller)
        self._manager.permissions.extend(self._permissions(name))
        return controller

    def _roles(self, clusters: ClusterSelection | None) -> list[Role]:
        selection = clusters or ClusterSelection()
        has_provider = self._manager.has_provider
        local = selection.local if selection.local is not None else not has_provider
        provider = selection.provider if selection.provider is not None else has_provider
        roles: list[Role] = []
        if local:
            roles.append("hub")
        if provider:
            roles.append("member")
        return roles

    def _permissions(self, name: str) -> list[Permission]:
        """What this controller's wiring needs: reads for sources, writes for its kinds, events."""
        found: list[Permission] = []

        def grant(
            kind: Kind,
            verbs: tuple[str, ...],
            clusters: ClusterSelection | None,
            why: str,
            subresource: str | None = None,
            declared: _Declared | None = None,
        ) -> None:
            for role in self._roles(clusters):
                found.append(
                    Permission(
                        kind,
                        verbs,
                        role,
                        namespace=declared.namespace if declared else None,
                        subresource=declared.subresource if declared else subresource,
                        resource=declared.resource if declared else None,
                        reason=f"controller {name}: {why}",
                    )
                )

        # The clusters requests can name: events are recorded in the request's cluster.
        reconciled: list[ClusterSelection | None] = []
        if self._for is not None:
            kind, clusters = self._for.kind, self._for.clusters
            reconciled.append(clusters)
            grant(kind, (*READ, "update", "patch"), clusters, "reconciles it (finalizers, metadata)")
            grant(kind, ("get", "update", "patch"), clusters, "status updates", subresource="status")
            grant(
                kind, ("update",), clusters, "owner references block its deletion", subresource="finalizers"
            )
            for owned in self._owns:
                grant(owned.kind, (*READ, *WRITE), owned.clusters or clusters, f"owns it for {kind.kind}")
                reconciled.append(owned.clusters or clusters)  # the owner, in the owned object's cluster
        for source in self._watches:
            if isinstance(source, KindSource):
                grant(source.kind, READ, source.clusters, "watches it")
            # A handler that maps (or a channel's requests) may name any cluster, not the event's.
            if isinstance(source, KindSource) and source.handler.same_cluster:
                reconciled.append(source.clusters)
            else:
                reconciled.append(ClusterSelection(local=True))
        for declared in self._declared:
            if declared.verbs == READ and declared.namespace is not None:
                found.extend(self._cache_reads(name, declared))
            else:
                grant(declared.kind, declared.verbs, declared.clusters, "declared", declared=declared)
        roles = {role for clusters in reconciled or [None] for role in self._roles(clusters)}
        for event in _EVENT_KINDS:
            for role in sorted(roles):
                reason = f"controller {name}: records events"
                found.append(Permission(event, ("create", "patch"), role, reason=reason))
        return found

    def _cache_reads(self, name: str, declared: _Declared) -> list[Permission]:
        """``reads(kind, namespace=ns)``: a Role in ``ns`` only where the cache is scoped to it.

        A cache read starts the kind's informer, which lists cluster-wide unless
        the cluster's cache is scoped (``ClusterOptions.cache_namespace``,
        ``CacheOptions.namespaces`` or the kind's ``ByObject``): a Role alone
        would leave that list refused and the reconcile waiting for a sync.
        """
        found = []
        for role in self._roles(declared.clusters):
            scope = self._cache_scope(role, declared.kind)
            scoped = scope is not None and declared.namespace in scope
            why = "declared"
            if not scoped:
                why = f"declared (its cache lists cluster-wide, not {declared.namespace} only)"
            found.append(
                Permission(
                    declared.kind,
                    declared.verbs,
                    role,
                    namespace=declared.namespace if scoped else None,
                    resource=declared.resource,
                    reason=f"controller {name}: {why}",
                )
            )
        return found

    def _cache_scope(self, role: Role, kind: Kind) -> frozenset[str] | None:
        """The namespaces ``role``'s clusters cache ``kind`` in; ``None``: every namespace (or unknown)."""
        if role == "hub":
            options = self._manager._cluster_options  # the local cluster's, as the manager opens it
        else:
            clusters = getattr(self._manager.provider, "clusters", None)  # a ClusterSet's providers
            options = getattr(clusters, "options", None)
        if not isinstance(options, ClusterOptions):
            return None
        by_object = options.cache.by_object.get(kind)
        for namespaces in (
            by_object.namespaces if by_object is not None else None,
            options.cache.namespaces,
            [options.cache_namespace] if options.cache_namespace is not None else None,
        ):
            if namespaces is not None:
                return frozenset(namespaces)
        return None

    build = complete


_EVENT_KINDS = (Kind("events.k8s.io/v1", "Event"), Kind("v1", "Event"))


def controller_managed_by(manager: Manager) -> Builder:
    """Start wiring a controller for ``manager``."""
    return Builder(manager)
