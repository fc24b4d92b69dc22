"""One namespace of a cluster, seen as a cluster of its own, on the host's connection and informers.

Tenants of one API server, each in a namespace, are a fleet too, and a
reconciler written for whole clusters should run per tenant without knowing.
:class:`NamespacedCluster` is that view of a *host* :class:`Cluster`. What it
shares and what it pins:

- **One connection, one informer per kind.** The view has no session, probe or
  informer of its own: its cache serves every kind from the host's shared
  informer, filtered to the namespace, so a thousand tenants cost one watch
  per kind, not a thousand. An index by namespace on the host's informer makes
  a view's list cost what its namespace holds, not what the host holds.
- **Namespaced kinds are pinned.** A read or write that names no namespace
  goes to the view's namespace; one that names another namespace is refused
  with :class:`~mcruntime.Forbidden` (status 403, as a tenant's own RBAC would
  answer) naming the cluster and both namespaces, before any request is sent.
  Events reach the view's handlers only for objects of its namespace.
- **Cluster-scoped kinds are shared, read-only.** Namespaces, Nodes, CRDs
  belong to every tenant of the host at once: the view reads them (client and
  cache, unfiltered) but refuses to create, change or delete them, since such
  a write would change every tenant's world.
- **Its lifetime is its own.** Stopping the view disengages everything engaged
  with it and ends the tasks spawned into it; the host runs on. Stopping the
  host stops every view of it first.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable, Mapping
from typing import TYPE_CHECKING, Any

from .._base.errors import Forbidden
from .._base.kind import Kind, Resource
from .._base.labels import LabelSelector
from .._base.objects import JSON, json_copy, metadata, to_json_shape
from .._base.tasks import TaskSet
from .._cache.cache import Cache, InformerKey
from .._cache.informer import HandlerRegistration, IndexFunc, Informer, ResourceEventHandler
from .._client.client import Client, WatchEvent
from .._client.transport import Transport
from .._config.kubeconfig import ClusterConfig
from .cluster import Cluster, ClusterOptions

if TYPE_CHECKING:
    from kubernetes_asyncio import client as k8s_client

NAMESPACE_INDEX = "mcruntime.dev/namespace"
"""The host informers' index by ``metadata.namespace`` (``""`` for cluster-scoped objects)."""


def _namespace_of(obj: JSON) -> list[str]:
    return [str(metadata(obj).get("namespace") or "")]


def _visible(obj: JSON, namespace: str) -> bool:
    """Whether a view of ``namespace`` sees ``obj``: its namespace's objects and cluster-scoped ones."""
    found = metadata(obj).get("namespace")
    return not found or found == namespace


def _refused(cluster: str, namespace: str, kind: str, wanted: str | None, name: str | None) -> Forbidden:
    if wanted:
        why = f"namespace {wanted!r} is outside it"
    else:
        why = "the kind is cluster-scoped: shared by every namespace of the host, so read-only here"
    return Forbidden(
        f"refused before sending: cluster {cluster!r} is namespace {namespace!r} only, and {why}",
        cluster=cluster,
        status=403,
        reason="Forbidden",
        kind=kind,
        namespace=wanted,
        name=name,
    )


class _ScopedHandler(ResourceEventHandler):
    """A consumer's handler behind a filter: only the view's namespace (and cluster-scoped objects)."""

    def __init__(self, inner: ResourceEventHandler, namespace: str) -> None:
        self.namespace = namespace
        on_add, on_update, on_delete = inner.on_add, inner.on_update, inner.on_delete

        def add(obj: JSON, initial: bool) -> None:
            if on_add is not None and _visible(obj, namespace):
                on_add(obj, initial)

        def update(old: JSON, new: JSON) -> None:
            if on_update is not None and _visible(new, namespace):
                on_update(old, new)

        def delete(obj: JSON) -> None:
            if on_delete is not None and _visible(obj, namespace):
                on_delete(obj)

        super().__init__(
            add if on_add else None, update if on_update else None, delete if on_delete else None
        )


class _NamespaceInformer(Informer):
    """The host's shared informer as one namespace sees it; it never runs, the host's does.

    ``store`` and ``stats`` are the shared informer's (every namespace's objects,
    one set of counters); ``list``, ``get`` and handlers see the namespace only.
    """

    def __init__(self, shared: Informer, client: Client, namespace: str) -> None:
        super().__init__(
            client,
            shared.kind,
            namespace=namespace,
            label_selector=shared.label_selector.text or None,
            field_selector=shared.field_selector,
        )
        self.shared = shared
        self.store = shared.store
        self.stats = shared.stats
        self._namespace = namespace

    @property
    def has_synced(self) -> bool:
        return self.shared.has_synced

    async def wait_for_sync(self, timeout: float | None = None) -> bool:
        return await self.shared.wait_for_sync(timeout)

    def add_handler(self, handler: ResourceEventHandler) -> HandlerRegistration:
        return self.shared.add_handler(_ScopedHandler(handler, self._namespace))

    def remove_handler(self, registration: HandlerRegistration) -> None:
        self.shared.remove_handler(registration)

    @property
    def handler_count(self) -> int:
        return sum(
            1
            for registration in self.shared._handlers
            if isinstance(registration.handler, _ScopedHandler)
            and registration.handler.namespace == self._namespace
        )

    def add_index(self, name: str, extract: IndexFunc) -> None:
        self.shared.add_index(name, extract)

    def list(self, namespace: str | None = None) -> list[JSON]:
        if namespace not in (None, self._namespace):
            raise _refused(self.client.cluster, self._namespace, self.kind.kind, namespace, None)
        if self.store.has_index(NAMESPACE_INDEX):
            return self.store.by_index(NAMESPACE_INDEX, self._namespace) + self.store.by_index(
                NAMESPACE_INDEX, ""
            )
        return [obj for obj in self.shared.list() if _visible(obj, self._namespace)]

    def get(self, key: str) -> JSON | None:
        found = self.shared.get(key)
        return found if found is not None and _visible(found, self._namespace) else None

    async def run(self) -> None:
        raise RuntimeError(f"{self!r} is a view: the host's informer runs, not this one")


class _NamespacedClient(Client):
    """The host's client, pinned to one namespace (see the module's docstring)."""

    def __init__(self, host: Client, namespace: str, cluster: str) -> None:
        super().__init__(host.transport, host.discovery)
        self.namespace = namespace
        self._cluster = cluster

    @property
    def cluster(self) -> str:
        return self._cluster

    def __repr__(self) -> str:
        return f"<Client cluster={self._cluster!r} namespace={self.namespace!r}>"

    def _pin(self, resource: Resource, namespace: str | None, name: str | None, write: bool) -> str | None:
        if resource.namespaced:
            if namespace in (None, "", self.namespace):
                return self.namespace
            raise _refused(self._cluster, self.namespace, resource.kind, namespace, name)
        if write:
            raise _refused(self._cluster, self.namespace, resource.kind, None, name)
        return None

    async def _call(
        self,
        method: str,
        resource: Resource,
        *,
        namespace: str | None = None,
        name: str | None = None,
        subresource: str | None = None,
        params: Mapping[str, str] | None = None,
        body: Any = None,
        content_type: str = "application/json",
        idempotent: bool | None = None,
        accept: str = "application/json",
    ) -> Any:
        return await super()._call(
            method,
            resource,
            namespace=self._pin(resource, namespace, name, write=method != "GET"),
            name=name,
            subresource=subresource,
            params=params,
            body=body,
            content_type=content_type,
            idempotent=idempotent,
            accept=accept,
        )

    async def _target(self, obj: Any, namespace: str | None) -> tuple[JSON, Resource, str | None, str | None]:
        body = to_json_shape(obj)
        if isinstance(body, dict) and not namespace:
            meta = body.get("metadata")
            if not (isinstance(meta, dict) and meta.get("namespace")):
                namespace = self.namespace  # an object that names no namespace is created in ours
        return await super()._target(body, namespace)

    async def watch(
        self,
        kind: Kind,
        *,
        namespace: str | None = None,
        resource_version: str | None = None,
        label_selector: str | Mapping[str, str] | None = None,
        field_selector: str | None = None,
        allow_bookmarks: bool = True,
        timeout_seconds: int | None = None,
        read_timeout: float | None = 90.0,
        metadata_only: bool = False,
    ) -> AsyncIterator[WatchEvent]:
        """Events of the namespace (or of a cluster-scoped kind); another namespace is refused."""
        pinned = self._pin(await self.resource(kind), namespace, None, write=False)
        async for event in super().watch(
            kind,
            namespace=pinned,
            resource_version=resource_version,
            label_selector=label_selector,
            field_selector=field_selector,
            allow_bookmarks=allow_bookmarks,
            timeout_seconds=timeout_seconds,
            read_timeout=read_timeout,
            metadata_only=metadata_only,
        ):
            yield event


class _NamespacedCache(Cache):
    """Reads of one namespace, served by the host cache's shared informers."""

    def __init__(self, host: Cache, client: _NamespacedClient, tasks: TaskSet, sync_timeout: float) -> None:
        super().__init__(client, tasks, sync_timeout=sync_timeout, namespace=client.namespace)
        self.host = host
        self._namespace = client.namespace
        self._views: dict[InformerKey, _NamespaceInformer] = {}

    def informers(self) -> list[Informer]:
        return list(self._views.values())

    def informer(
        self,
        kind: Kind,
        *,
        namespace: str | None = None,
        label_selector: str | Mapping[str, str] | None = None,
        field_selector: str | None = None,
        metadata_only: bool = False,
    ) -> Informer:
        """The namespace's view of the host's shared informer for this kind, selector and view."""
        self._scope(namespace)
        selector = LabelSelector.parse(label_selector).text
        key: InformerKey = (kind, (self._namespace,), selector, field_selector, metadata_only)
        view = self._views.get(key)
        if view is None:
            if NAMESPACE_INDEX not in self.host.indexes(kind):
                self.host.index_field(kind, NAMESPACE_INDEX, _namespace_of)
            shared = self.host.informer(
                kind,
                label_selector=selector or None,
                field_selector=field_selector,
                metadata_only=metadata_only,
            )
            view = _NamespaceInformer(shared, self.client, self._namespace)
            self._views[key] = view
        return view

    def index_field(self, kind: Kind, name: str, extract: IndexFunc) -> None:
        """Index ``kind`` on the host: one index serves every namespace of it, so it is shared."""
        self.host.index_field(kind, name, extract)

    def indexes(self, kind: Kind) -> list[str]:
        return self.host.indexes(kind)

    async def wait_for_sync(self, timeout: float | None = None) -> bool:
        views = list(self._views.values())
        return all([await view.wait_for_sync(timeout) for view in views])

    @property
    def has_synced(self) -> bool:
        return all(view.has_synced for view in self._views.values())

    def _scope(self, namespace: str | None) -> str | None:
        if namespace not in (None, self._namespace):
            raise _refused(self.cluster, self._namespace, "cache", namespace, None)
        return self._namespace

    async def get_or_none(
        self, kind: Kind, name: str, *, namespace: str | None = None, metadata_only: bool = False
    ) -> JSON | None:
        """A copy of the namespace's object (or a cluster-scoped one) from the shared cache."""
        self._scope(namespace)
        informer = await self._synced(kind, metadata_only)
        found = informer.get(f"{self._namespace}/{name}")
        if found is None:
            found = informer.get(name)  # a cluster-scoped kind's key has no namespace
        return json_copy(found) if found is not None else None

    async def list(
        self,
        kind: Kind,
        *,
        namespace: str | None = None,
        label_selector: str | Mapping[str, str] | None = None,
        index: tuple[str, str] | None = None,
        metadata_only: bool = False,
    ) -> list[JSON]:
        """Copies of the namespace's matching objects; a list costs what the namespace holds."""
        self._scope(namespace)
        informer = await self._synced(kind, metadata_only)
        selector = LabelSelector.parse(label_selector)
        if index is not None:
            candidates = [obj for obj in informer.store.by_index(*index) if _visible(obj, self._namespace)]
        else:
            candidates = informer.list()
        return [
            json_copy(obj)
            for obj in candidates
            if selector.empty or selector.matches(metadata(obj).get("labels"))
        ]


class _OwnNamespaceCache(Cache):
    """Informers of one namespace, the view's own, on the host's connection.

    What a view uses when the host should hold only some namespaces' objects:
    each kind is listed and watched in this namespace alone, and the informers
    end with the view. Another namespace is refused as the pinned client
    refuses it, with :class:`~mcruntime.Forbidden`.
    """

    def _check_namespace(self, kind: Kind, namespace: str | None) -> None:
        own = self.namespace or ""
        if namespace not in (None, own) and self._kind_scope(kind).namespaces is not None:
            raise _refused(self.cluster, own, "cache", namespace, None)


class NamespacedCluster(Cluster):
    """One namespace of a host cluster as a cluster: pinned client and cache, shared connection.

    For tenants of one API server, and for testing fleet logic on one API
    server: a reconciler written for whole clusters runs per namespace
    unchanged. The view opens nothing of its own (no session, no probe, no
    informer), so any number of views of one host cost one connection and one
    informer per kind; the host must be started and outlive its views (a
    stopping host stops its views first). Namespaced kinds are pinned to
    ``namespace`` (another namespace is refused with :class:`~mcruntime.Forbidden`
    before a request is sent); cluster-scoped kinds are readable and never
    written; events arrive only for the namespace's objects. ``name`` defaults
    to the namespace. Health is the host's; ``replace_credentials`` is the
    host's business; ``kubernetes_configuration`` is the host's and is *not*
    pinned (typed API classes reach every namespace).

    ``shared_informers=False`` gives the view informers of its own, listing
    and watching its namespace only, ended with the view: the host then holds
    only the objects of namespaces that have a view, at the cost of one watch
    per kind per view. For a few namespaces selected out of many.
    """

    def __init__(
        self, host: Cluster, namespace: str, *, name: str | None = None, shared_informers: bool = True
    ) -> None:
        # Cluster.__init__ would open a connection of its own: the one thing a view must not have.
        if not namespace:
            raise ValueError(f"a namespace view of cluster {host.name!r} needs a namespace name")
        if host.options.cache_namespace not in (None, namespace):
            raise ValueError(
                f"cluster {host.name!r} caches namespace {host.options.cache_namespace!r} only "
                f"(ClusterOptions.cache_namespace): it cannot serve a view of namespace {namespace!r}"
            )
        self.name: str = name if name is not None else namespace
        self.namespace: str = namespace
        self.host: Cluster = host
        self.config: ClusterConfig = host.config
        self.options: ClusterOptions = host.options
        self._tasks = TaskSet(f"cluster {self.name}")
        self.transport: Transport = host.transport
        client = _NamespacedClient(host.client, namespace, self.name)
        self.client: Client = client
        options = host.options
        self.cache: Cache = (
            _NamespacedCache(host.cache, client, self._tasks, options.cache_sync_timeout)
            if shared_informers
            else _OwnNamespaceCache(
                client,
                self._tasks,
                sync_timeout=options.cache_sync_timeout,
                transform=options.transform,
                resync_period=options.resync_period,
                read_timeout=options.watch_read_timeout,
                namespace=namespace,
            )
        )
        self.started_at = None
        self._stopped = False
        self._teardown = None
        self._stop_callbacks = []
        self._unhook_host: Callable[[], None] | None = None

    def __repr__(self) -> str:
        state = "stopped" if self._stopped else "started" if self.started_at else "new"
        return f"<NamespacedCluster {self.name!r} namespace={self.namespace!r} of {self.host.name!r} {state}>"

    async def start(self) -> None:
        """Mark the view started and tie it to the host's lifetime; the host must be running."""
        if self._stopped:
            raise RuntimeError(f"cluster {self.name!r} was stopped; create a new NamespacedCluster")
        if self.host.stopped or self.host.started_at is None:
            raise RuntimeError(f"cluster {self.name!r}: its host cluster {self.host.name!r} is not running")
        if self.started_at is None:
            self.started_at = time.time()
            self._unhook_host = self.host.on_stop(self.stop)

    async def _tear_down(self) -> None:
        if self._unhook_host is not None:
            self._unhook_host()
        await self._notify_stop()
        await self._tasks.close()  # its own informers end here; the connection (and shared ones) stay

    def failing_loops(self) -> list[str]:
        """The host's failing loops (the informers are there) and the view's own."""
        return self.host.failing_loops() + super().failing_loops()

    def replace_credentials(self, config: ClusterConfig) -> bool:
        """Always ``False``: the credential is the host's; rotate it there and every view follows."""
        return False

    async def kubernetes_configuration(self) -> k8s_client.Configuration:
        """The host's configuration: typed API classes are **not** pinned to the namespace."""
        return await self.host.kubernetes_configuration()
