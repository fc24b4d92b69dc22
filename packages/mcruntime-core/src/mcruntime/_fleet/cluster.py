"""A cluster: a name, a client, a cache and a lifetime.

Everything that talks to one API server hangs off its ``Cluster``: the HTTP
session, discovery, every informer task. ``stop`` ends all of it (watches
closed, sessions closed, private files deleted), so removing a cluster from a
fleet leaves no task and no socket behind.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from types import TracebackType
from typing import TYPE_CHECKING

from .._base.backoff import DEFAULT_BACKOFF, Backoff
from .._base.tasks import TaskSet
from .._cache.cache import Cache
from .._cache.informer import Transform, strip_managed_fields
from .._cache.options import CacheOptions
from .._client.client import Client
from .._client.discovery import Discovery
from .._client.field_validation import FieldValidation, checked_field_validation
from .._client.health import ClusterHealth
from .._client.liveness import server_liveness
from .._client.transport import RetryPolicy, Transport
from .._config.exec import DEFAULT_MAX_OUTPUT as DEFAULT_EXEC_MAX_OUTPUT
from .._config.exec import DEFAULT_TIMEOUT as DEFAULT_EXEC_TIMEOUT
from .._config.exec import ExecLimits
from .._config.kubeconfig import ClusterConfig, redacted_url
from .status import forbidden

if TYPE_CHECKING:
    from kubernetes_asyncio import client as k8s_client

log = logging.getLogger("mcruntime.cluster")
StopCallback = Callable[[], Awaitable[None] | None]


@dataclass(frozen=True)
class ClusterOptions:
    """Tuning for one cluster's client and cache."""

    request_timeout: float = 30.0
    """The most one request may take, answer included (a large list can be slow)."""
    connect_timeout: float = 5.0
    """The most opening a connection (TCP and TLS) may take."""
    health_probe_interval: float = 5.0
    """Seconds an API server may be silent before it is probed (``GET /version``).

    Silence is the server's, not the cluster's: any answer to any cluster of
    the same server (a response, a watch event or bookmark) counts, and one
    probe covers all of them. A fleet whose watches deliver events is not
    probed at all."""
    health_probe_timeout: float = 4.0
    """How long a probe waits for an answer; a hung server is unhealthy, and
    its requests fail fast, within ``health_probe_interval + health_probe_timeout``
    (9 s with the defaults)."""
    health_credential_interval: float = 300.0
    """Seconds a cluster's credential may go unused before a probe checks it.

    Whether a token is still accepted is per cluster, and an open watch does
    not tell (it outlives a revoked token). Any request answered with
    something other than 401 vouches for it, a watch re-opening (every 5 to
    10 min) included; an idle cluster is checked this often (or less, see
    ``health_probe_budget``). A request refused with 401 after a fresh
    credential marks the cluster at once whatever this says. Five minutes
    keeps a healthy fleet's idle CPU near Go's, which never checks; set 60
    to hear of an idle cluster's revoked token sooner, at about 0.6 ms of
    CPU per cluster per check."""
    health_probe_budget: float | None = 20.0
    """Routine probes per second for all clusters of the process together.

    A fleet larger than ``budget * health_credential_interval`` (6,000
    clusters with the defaults) has its idle credentials checked less often:
    every ``clusters / budget`` seconds, so 500 s at 10,000 clusters. That
    keeps idle CPU flat as the fleet grows. A failing request still probes its
    cluster at once, and a failing cluster is re-probed on its backoff, so
    trouble seen by traffic shows just as fast. ``None`` checks every cluster
    every ``health_credential_interval``."""
    share_connections: bool = True
    """Pool connections with other clusters that reach the same API server the same way.

    Clusters with the same server, CA, proxy and TLS server name whose
    identity is a bearer token (or nothing) share one connection pool, and
    each request carries its own cluster's credential, as client-go does: a
    fleet of token users on a few servers pays a TLS handshake per connection
    it really needs, not per cluster. A client certificate shares only with
    clusters presenting the same certificate. Health, watches and failures
    stay per cluster. A shared pool sends at most ``server_requests_in_flight``
    requests at once (watches aside): a burst from many clusters waits its turn
    on a few dozen connections instead of opening one each."""
    server_requests_in_flight: int = 64
    """Requests (watches aside) a shared connection pool sends to its server at once.

    The rest wait, and each freed place goes to the waiting clusters in turn,
    one request each, so a cluster with a long queue does not hold back the
    others of its server. The wait counts against the request's timeout. The
    cluster that opens the pool sets the bound for every cluster sharing it;
    an unshared cluster (``share_connections=False``) has no bound."""
    http2_watches: bool = True
    """Open watches as HTTP/2 streams where the server offers HTTP/2.

    The watches of every cluster sharing a connection pool (see
    ``share_connections``), or of one cluster when it shares none, then ride
    a few connections per server instead of one connection each: 10,000
    clusters on 10 servers hold about 10 sockets for their watches, not
    10,000. Each watch keeps its own flow-control window, so a reader that
    falls behind stalls only its own stream. Servers that do not offer
    HTTP/2, or that are reached through a proxy, get HTTP/1.1 as before."""
    exec_timeout: float = DEFAULT_EXEC_TIMEOUT
    """Seconds an exec credential plugin may run before it is killed and its run fails.

    While it runs, the cluster's status says it is waiting for the plugin and for
    how long; after this it is reported as the cluster's error."""
    exec_max_output: int = DEFAULT_EXEC_MAX_OUTPUT
    """Bytes an exec credential plugin may print on stdout (and on stderr); more fails the run."""
    watch_read_timeout: float = 90.0
    """Seconds a watch may deliver nothing (not even a bookmark) before it is dropped as silent.

    Over HTTP/1.1 it is the socket's read timeout. Over HTTP/2 one timer per
    connection checks its streams, so a silent watch is found within a
    quarter of this after it (90 to 112.5 s by default), and a PING then
    asks whether the whole connection is gone."""
    cache_sync_timeout: float = 60.0
    resync_period: float | None = None
    discovery_refresh_interval: float = 5.0
    transform: Transform | None = strip_managed_fields
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    backoff: Backoff = DEFAULT_BACKOFF
    """The retry loops' backoff (informers, the probe after failures)."""
    cache_namespace: str | None = None
    """Cache namespaced kinds of this namespace only (cluster-scoped kinds whole).

    Shorthand for ``cache=CacheOptions(namespaces=[namespace])``. For
    controllers that work in one namespace: informers then need only
    namespaced ``list``/``watch`` permissions and hold only that namespace's
    objects. Cache reads of another namespace raise
    :class:`~mcruntime.NamespaceNotCached` (a ``ValueError``); the client still
    reaches every namespace.
    """
    cache: CacheOptions = field(default_factory=CacheOptions)
    """What the cache holds: several namespaces, and per kind its own namespaces,
    label and field selectors and transform (:class:`~mcruntime.ByObject`)."""
    field_validation: FieldValidation | None = None
    """Sent with every write of the cluster's client (see :class:`~mcruntime.Client`).

    ``"Strict"`` refuses a write with a field the kind does not have, as
    controller-runtime's ``client.WithFieldValidation(c, "Strict")`` does;
    ``None`` leaves it to the server, which stores the object without the
    field and warns."""

    def __post_init__(self) -> None:
        if not self.exec_timeout > 0 or self.exec_max_output < 1:
            raise ValueError("ClusterOptions: exec_timeout and exec_max_output must be positive")
        if self.server_requests_in_flight < 1:
            raise ValueError(
                f"ClusterOptions: server_requests_in_flight must be at least 1, "
                f"got {self.server_requests_in_flight!r}"
            )
        checked_field_validation(self.field_validation, "ClusterOptions: field_validation")
        if self.cache_namespace is not None and self.cache.namespaces is not None:
            raise ValueError(
                "ClusterOptions: give cache_namespace or cache=CacheOptions(namespaces=...), not both"
            )


class Cluster:
    """One API server and everything mcruntime runs against it.

    Usable as ``async with Cluster(name, config) as cluster:``; ``start`` is cheap
    (no request is made until something reads), ``stop`` is idempotent.
    """

    def __init__(self, name: str, config: ClusterConfig, options: ClusterOptions | None = None) -> None:
        self.name = name
        self.config: ClusterConfig = config
        self.options: ClusterOptions = options or ClusterOptions()
        self._tasks = TaskSet(f"cluster {name}")
        self.transport: Transport = Transport(
            config,
            name,
            request_timeout=self.options.request_timeout,
            retry=self.options.retry,
            connect_timeout=self.options.connect_timeout,
            share_connections=self.options.share_connections,
            exec_limits=ExecLimits(self.options.exec_timeout, self.options.exec_max_output),
            requests_in_flight=self.options.server_requests_in_flight,
            http2_watches=self.options.http2_watches,
        )
        self.client: Client = Client(
            self.transport,
            Discovery(self.transport, min_refresh_interval=self.options.discovery_refresh_interval),
            field_validation=self.options.field_validation,
        )
        self.cache: Cache = Cache(
            self.client,
            self._tasks,
            sync_timeout=self.options.cache_sync_timeout,
            transform=self.options.transform,
            resync_period=self.options.resync_period,
            read_timeout=self.options.watch_read_timeout,
            namespace=self.options.cache_namespace,
            options=self.options.cache,
            backoff=self.options.backoff,
        )
        self.started_at: float | None = None
        self._stopped = False
        self._teardown: asyncio.Future[None] | None = None
        self._stop_callbacks: list[StopCallback] = []

    def __repr__(self) -> str:
        state = "stopped" if self._stopped else "started" if self.started_at else "new"
        return f"<Cluster {self.name!r} {redacted_url(self.config.server)} {state}>"

    @property
    def stopped(self) -> bool:
        return self._stopped

    @property
    def tasks(self) -> TaskSet:
        """The owner of this cluster's background work.

        Components engaged with the cluster may spawn into it so that they end
        with it.
        """
        return self._tasks

    async def start(self) -> None:
        """Start the health probe and open the HTTP session; informers start lazily on first read.

        The probe starts first and keeps running if opening fails (unusable TLS
        material, say), so the failure shows in :attr:`health` and a fixed
        cluster recovers without a restart.
        """
        if self._stopped:
            raise RuntimeError(f"cluster {self.name!r} was stopped; create a new Cluster")
        if self.started_at is None:
            self.started_at = time.time()
            self._tasks.supervise(self._probe, "health-probe", backoff=self.options.backoff)
        await self.transport.open()

    async def _probe(self) -> None:
        await self.transport.health.probe_forever(
            self.transport.probe,
            interval=self.options.health_probe_interval,
            timeout=self.options.health_probe_timeout,
            budget=self.options.health_probe_budget,
            credential_interval=self.options.health_credential_interval,
            backoff=self.options.backoff,
            server=server_liveness(self.config.endpoint_fingerprint()),
        )

    def on_stop(self, callback: StopCallback) -> Callable[[], None]:
        """Call ``callback`` (sync or async) when the cluster stops; returns an unregister.

        This is how disengagement follows the cluster's lifetime: a controller
        engaged with the cluster removes its handlers and purges its queued
        requests here, before the cluster's tasks and sockets go.
        """
        self._stop_callbacks.append(callback)

        def unregister() -> None:
            if callback in self._stop_callbacks:
                self._stop_callbacks.remove(callback)

        return unregister

    async def stop(self) -> None:
        """Tell everyone engaged, then end every task, connection and private file.

        Stop callbacks run first (disengagement), then every watch and task is
        cancelled, every connection closed and the private files deleted.
        """
        if self._teardown is None:
            self._stopped = True
            self._teardown = asyncio.ensure_future(self._tear_down())
        elif self._teardown is asyncio.current_task():
            return  # a stop callback stopping its own cluster: the teardown is already running
        # Shielded: a caller cancelled halfway (a provider shutting down, a timeout)
        # must not leave tasks running or sockets open; every caller waits for the end.
        await asyncio.shield(self._teardown)

    async def _tear_down(self) -> None:
        await self._notify_stop()
        await self._tasks.close()
        await self.client.discovery.close()
        await self.transport.close()

    async def _notify_stop(self) -> None:
        """Run the stop callbacks, newest first; one that fails is logged and the rest still run."""
        for callback in list(reversed(self._stop_callbacks)):
            try:
                result = callback()
                if inspect.isawaitable(result):
                    await result
            except Exception:
                log.exception("cluster %r: a stop callback failed", self.name)
        self._stop_callbacks.clear()

    def replace_credentials(self, config: ClusterConfig) -> bool:
        """Swap in a rotated credential without restarting caches, when possible.

        Possible whenever only the user changed: a token, token file, exec
        plugin or client certificate and key (Cluster API rotates those). The
        next request carries the new token; new connections present the new
        certificate. Returns ``False`` when the endpoint or trust changed, or
        for legacy auth-providers, which need a new cluster.
        """
        if config.endpoint_fingerprint() != self.config.endpoint_fingerprint():
            return False
        if config.trust != self.config.trust:
            return False
        if "auth-provider" in (config.auth_kind, self.config.auth_kind):
            return False
        self.transport.replace_credentials(config)
        self.config = config
        return True

    async def __aenter__(self) -> Cluster:
        await self.start()
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.stop()

    @property
    def health(self) -> ClusterHealth:
        """The health probe's verdict, with the last contact and error of any request.

        The one record ``statuses()``, ``/readyz`` and the metrics read.
        """
        return self.transport.health.snapshot()

    def failing_loops(self) -> list[str]:
        """Why each of this cluster's background loops that died is down (restarting)."""
        return [f"{loop.name} died ({loop.last_error}); restarting" for loop in self._tasks.failing()]

    def trouble(self) -> str | None:
        """Why this cluster, answering its probe, still cannot be worked on; ``None`` if nothing stops it.

        A loop that died, a permission missing or an informer failing (its kind
        not served, say, unless its sources said it may not be): the one verdict
        ``statuses()``, ``/readyz`` and ``mcruntime_cluster_healthy`` all read, so
        that they agree.
        """
        failing = self.failing_loops()
        if failing:
            return "; ".join(failing)
        missing = self.health.missing_permissions
        if missing:
            return forbidden(missing)
        stale = sorted(
            {
                f"{informer.kind.kind} ({informer.kind.api_version}): {broken}"
                for informer in self.cache.informers()
                if (broken := informer.broken) is not None
            }
        )
        return f"cache failing: {'; '.join(stale)}" if stale else None

    async def kubernetes_configuration(self) -> k8s_client.Configuration:
        """An isolated kubernetes-asyncio ``Configuration`` for typed API classes.

        Valid while the cluster runs. Bearer tokens are set as a snapshot at the
        time of the call.
        """
        return await self.transport.kubernetes_configuration()
