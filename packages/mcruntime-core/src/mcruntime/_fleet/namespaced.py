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

The view is built by composition: its client (:mod:`.namespaced_client`) and
cache (:mod:`.namespaced_cache`) pin or check the namespace, then delegate to
the public read and write methods of the host's client and informers. No
private method of :class:`Client`, :class:`Cache` or :class:`Informer` is
overridden, so their internals may change without unpinning a view.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from .._base.tasks import TaskSet
from .._cache.cache import Cache
from .._client.client import Client
from .._client.transport import Transport
from .._config.kubeconfig import ClusterConfig
from .cluster import Cluster, ClusterOptions
from .namespaced_cache import NamespacedCache
from .namespaced_client import NamespacedClient

if TYPE_CHECKING:
    from kubernetes_asyncio import client as k8s_client


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
        client = NamespacedClient(host.client, namespace, self.name)
        self.client: Client = client
        options = host.options
        source = (
            host.cache
            if shared_informers
            else Cache(  # informers of the view's own, on its pinned client, ended with the view
                client,
                self._tasks,
                sync_timeout=options.cache_sync_timeout,
                transform=options.transform,
                resync_period=options.resync_period,
                read_timeout=options.watch_read_timeout,
                namespace=namespace,
                backoff=options.backoff,
            )
        )
        self.cache: Cache = NamespacedCache(
            source, client, self._tasks, options.cache_sync_timeout, shared=shared_informers
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
