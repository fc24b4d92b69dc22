"""The manager: runs the provider and the controllers, and engages clusters.

The manager is the :class:`Aware` a provider talks to. ``engage`` fans a
cluster out to every engaged component concurrently and remembers it, so a
controller added later is engaged with every cluster already there (the basic
coordinator of multicluster-runtime forgets this). Without a provider the
manager engages only its local cluster, and the same controllers and
reconcilers run single-cluster.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import signal
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from .._base.errors import ClusterNotFound
from .._base.kind import Kind
from .._base.limits import raise_open_files_limit
from .._base.permissions import Permission
from .._base.tasks import TaskSet
from .._cache.informer import IndexFunc
from .._config.kubeconfig import ClusterConfig
from .._control.controller import Controller
from .._control.events import EventRecorder
from .._coordination.coordinator import Coordinator, ReportsFailing, ReportsProblem, WorkGate
from .._coordination.leaderelection import LeaderElectionConfig, LeaderElector
from .._fleet.clients import FleetClient, RoutedClient
from .._fleet.cluster import Cluster, ClusterOptions
from .._fleet.protocols import Aware, Provider, ProviderRunnable
from .._fleet.status import ClusterStatus
from .._reconcile.request import LOCAL_CLUSTER
from .._webhook.options import WebhookOptions
from .gcfreeze import CacheFreezer
from .metrics import ManagerMetrics
from .readiness import cluster_not_ready, lifecycle_problem, readiness_lines
from .serving import Check, CheckLine, Checks, Endpoints
from .signals import install_signal_handlers
from .starting import PROVIDER_RETURNED, StartLatch
from .watch import RunWatch

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from .._webhook.server import WebhookServer
    from .settings import ManagerSettings

log = logging.getLogger("mcruntime.manager")


@runtime_checkable
class Runnable(Protocol):
    """Anything the manager runs alongside its controllers until shutdown."""

    async def start(self) -> None:
        """Run until cancelled."""
        ...


class Manager:
    """Owns the local cluster, the provider's clusters and every controller.

    ``provider`` discovers clusters (``None``: the local cluster only).
    ``local`` is the hub cluster's config (a kubeconfig, in-cluster, or ``None``
    for none); it is engaged under the name ``""``.
    """

    def __init__(
        self,
        provider: Provider | None = None,
        *,
        local: ClusterConfig | None = None,
        cluster_options: ClusterOptions | None = None,
        graceful_shutdown_timeout: float = 30.0,
        handle_signals: bool = True,
        leader_election: LeaderElectionConfig | None = None,
        metrics_address: str | None = None,
        health_probe_address: str | None = None,
        ready_min_share: float = 1.0,
        coordinator: Coordinator | None = None,
        gc_freeze: bool = True,
        field_manager: str | None = None,
        webhook: WebhookOptions | None = None,
    ) -> None:
        """Build a manager; nothing runs until :meth:`start`.

        ``leader_election`` needs ``local``: the Lease lives on the local cluster.
        ``coordinator`` decides which clusters this replica works on (for
        example a :class:`ShardedCoordinator`, which also needs ``local``);
        without one, every engaged cluster is worked on (on the leader only,
        with leader election). The two are alternatives.
        ``metrics_address`` and ``health_probe_address`` are ``host:port``
        (port 0 picks a free port; see :attr:`endpoints`). ``ready_min_share``
        is the share of engaged clusters whose caches must be synced and
        reachable for ``/readyz`` to pass (the local cluster always must).
        ``gc_freeze`` moves the objects of freshly synced caches out of the
        cyclic garbage collector's reach (``gc.freeze()``, once per burst of
        syncs, and once at start for the program's own modules and objects;
        while clusters engage, also right after each of CPython's own full
        collections, so a cold start's collections do not grow with the fleet),
        so reconcile latency does not grow with the size of the cache;
        turn it off if your program builds reference cycles it expects the
        collector to reclaim.
        ``field_manager`` names this program in the ``managedFields`` of what it
        writes: every engaged cluster's client whose own default is unset takes
        it, so writes carry it unless a call names another (the API server
        otherwise records a client's writes under a name derived from its
        user agent, the same for every program built on mcruntime).
        ``webhook`` configures the admission and conversion webhook server
        (:attr:`webhook`); it runs when given, or when webhooks are registered.
        """
        if provider is None and local is None:
            raise ValueError("a manager needs a provider, a local cluster, or both")
        if leader_election is not None and local is None:
            raise ValueError("leader election needs a local cluster to hold its Lease")
        if coordinator is not None and leader_election is not None:
            raise ValueError("choose leader election or a coordinator such as sharding, not both")
        if coordinator is not None and local is None:
            raise ValueError("a coordinator needs a local cluster (the hub) to coordinate on")
        if not 0.0 <= ready_min_share <= 1.0:
            raise ValueError(f"ready_min_share must be between 0 and 1, not {ready_min_share}")
        self.provider = provider
        self.field_manager = field_manager
        self._local_config = local
        self._cluster_options = cluster_options
        self.graceful_shutdown_timeout = graceful_shutdown_timeout
        self.handle_signals = handle_signals
        """Whether :meth:`start` stops on SIGTERM/SIGINT itself; a runner owning the signals turns it off."""
        self.webhook_calls_cut: int = 0
        """After :meth:`start` returns: webhook calls still running when the webhook server closed
        (each answered per its ``on_error``, and logged)."""
        self.drained: bool | None = None
        """After :meth:`start` returns: whether every in-flight reconcile finished within the grace period."""
        self.local: Cluster | None = None
        self.controllers: dict[str, Controller] = {}
        self._awares: list[Aware] = []
        self._runnables: list[Runnable] = []
        self._engaged: dict[str, Cluster] = {}
        self._tasks: dict[object, asyncio.Task[None]] = {}
        self._watch = RunWatch()
        # The manager's own long-lived loops (leader election, coordination), restarted if they die.
        self._loops = TaskSet("manager")
        self._loops.crash_listeners.append(self._count_crash)
        self._stop = asyncio.Event()
        self._latch = StartLatch()
        self._started = self._latch.started
        self._running = False
        self.client: RoutedClient = RoutedClient(self.get_cluster)
        self.fleet: FleetClient = FleetClient(self.clusters)
        self.engage_listeners: list[Callable[[str, Cluster], None]] = []
        self.disengage_listeners: list[Callable[[str, Cluster], None]] = []
        self.elector: LeaderElector | None = (
            LeaderElector(leader_election) if leader_election is not None else None
        )
        self.metrics: ManagerMetrics = ManagerMetrics(
            lambda: self.controllers.values(), self.clusters, self._cluster_states, self.elector
        )
        self._metrics_address = metrics_address
        self._probe_address = health_probe_address
        self._ready_min_share = ready_min_share
        self._healthz = Checks()
        self._readyz = Checks()
        self._healthz.add("ping", lambda: None)
        self._healthz.add("loops", self._loops_alive)
        self._readyz.add("manager", lambda: lifecycle_problem(self._started, self._stop))
        self._readyz.add_group("clusters", self._cluster_readiness)
        self.endpoints: Endpoints = Endpoints(self._healthz, self._readyz, self.metrics.registry)
        self._engage_started: dict[str, float] = {}
        self.freezer: CacheFreezer = CacheFreezer(gc_freeze)
        self.coordinator = coordinator
        if isinstance(self.elector or coordinator, ReportsProblem):
            self._readyz.add("coordination", self._coordination_problem)
        self.work: WorkGate = WorkGate(lambda: list(self.controllers.values()))
        self._webhook_options = webhook
        self._webhook: WebhookServer | None = None
        self._webhook_checked = False
        self.permissions: list[Permission] = []
        """What the controllers' wiring implies and :meth:`declare_rbac` adds (see ``mcruntime.rbac_for``)."""

    def declare_rbac(self, *permissions: Permission) -> None:
        """Permissions the program needs that no controller's wiring shows (a reader's own lookups).

        They are only collected, for ``mcruntime.rbac_for`` and ``mcruntime rbac``;
        nothing is checked at run time. One given without a reason gets one
        saying where it came from, so ``--explain`` accounts for every rule.
        """
        unexplained = "Manager.declare_rbac"
        self.permissions.extend(
            permission if permission.reason else dataclasses.replace(permission, reason=unexplained)
            for permission in permissions
        )

    @classmethod
    def from_settings(
        cls,
        provider: Provider | None = None,
        *,
        local: ClusterConfig | None = None,
        settings: ManagerSettings | None = None,
        cluster_options: ClusterOptions | None = None,
        handle_signals: bool = True,
        field_manager: str | None = None,
    ) -> Manager:
        """A manager configured from ``MCRUNTIME_*`` (or the given settings); ``field_manager`` as Manager's.

        The settings reach every cluster and controller, not only the local
        cluster: controllers built for this manager take their default lane
        width, global bound and cache-sync timeout from them, and a provider
        whose clusters use the default cache-sync timeout gets the configured
        one (a timeout chosen explicitly in the provider's options stays). Raises
        :class:`SettingsError` naming every invalid variable.
        """
        from .._fleet.clusterset import ClusterSet
        from .settings import ManagerSettings  # pydantic loads only for managers built from settings

        values = settings or ManagerSettings.load()
        options = cluster_options or ClusterOptions(cache_sync_timeout=values.cache_sync_timeout)
        # Provider clusters too, unless the provider chose its own timeout.
        provider_clusters = getattr(provider, "clusters", None)
        if isinstance(provider_clusters, ClusterSet) and (
            provider_clusters.options.cache_sync_timeout == ClusterOptions().cache_sync_timeout
        ):
            provider_clusters.options = dataclasses.replace(
                provider_clusters.options, cache_sync_timeout=values.cache_sync_timeout
            )
        manager = cls(
            provider,
            local=local,
            cluster_options=options,
            graceful_shutdown_timeout=values.graceful_shutdown_timeout,
            handle_signals=handle_signals,
            leader_election=values.leader_election_config(),
            metrics_address=values.metrics_bind_address or None,
            health_probe_address=values.health_probe_bind_address or None,
            ready_min_share=values.ready_min_share,
            coordinator=values.sharded_coordinator(),
            gc_freeze=values.gc_freeze,
            webhook=values.webhook_options(),
            field_manager=field_manager,
        )
        manager.settings = values
        return manager

    settings: ManagerSettings | None = None

    @property
    def webhook(self) -> WebhookServer:
        """The admission and conversion webhook server (``webhook_managed_by`` registers into it)."""
        if self._webhook is None:
            # Imported here: the server brings aiohttp's server side (~25 ms), which a
            # manager without webhooks never needs.
            from .._webhook.server import WebhookServer

            self._webhook = WebhookServer(
                self._webhook_options,
                clusters=self.clusters,
                field_manager=self.field_manager or "mcruntime-webhook",
                registry=self.metrics.registry,
            )
        return self._webhook

    async def _start_webhook(self) -> None:
        if self._webhook_options is None and (self._webhook is None or not self._webhook.has_handlers):
            return
        server = self.webhook
        await server.listen()  # before any cluster engages: registration needs the port
        self._loops.supervise(server.run, "webhook-server")
        if not self._webhook_checked:
            self._readyz.add_group("webhook", server.readiness)
            self._webhook_checked = True
        self._awares.append(server)

    # --- probes, metrics, events ------------------------------------------------------------

    @property
    def registry(self) -> CollectorRegistry:
        """The registry ``/metrics`` serves; add your own metrics here."""
        return self.metrics.registry

    def add_healthz_check(self, name: str, check: Check) -> None:
        """A liveness check: ``check()`` (sync or async) returns ``None`` or why it fails."""
        self._healthz.add(name, check)

    def add_readyz_check(self, name: str, check: Check) -> None:
        """A readiness check, alongside the built-in cache checks."""
        self._readyz.add(name, check)

    def event_recorder(self, controller: str) -> EventRecorder:
        """A recorder whose events go to the cluster of the request being reconciled."""
        return EventRecorder(controller, self.get_cluster)

    def _cluster_statuses(self) -> Mapping[str, ClusterStatus]:
        if self.provider is None:
            return {}
        try:
            return self.provider.statuses()
        except Exception:  # a provider's report must never break /readyz or /metrics
            log.exception("the provider's statuses() failed")
            return {}

    def _cluster_states(self) -> dict[str, str]:
        return {name: status.phase.value for name, status in self._cluster_statuses().items()}

    def _cluster_ready(self, name: str, cluster: Cluster) -> str | None:
        return cluster_not_ready(name, cluster, self.controllers.values())

    def _count_crash(self, loop: str, _error: BaseException) -> None:
        # Labelled by the loop's kind of work, not its cluster: bounded, and nothing to drop on churn.
        self.metrics.loop_crashes.labels(loop.split(" ", 1)[0]).inc()

    def _coordination_problem(self) -> str | None:
        reporter = self.elector or self.coordinator
        return reporter.problem() if isinstance(reporter, ReportsProblem) else None

    def _loops_alive(self) -> str | None:
        failing = self._loops.failing()
        for controller in self.controllers.values():  # their dispatchers and channel readers
            failing.extend(controller.tasks.failing())
        lines = [f"{loop.name} died ({loop.last_error}); restarting" for loop in failing]
        coordinator: object = self.coordinator  # a Coordinator may also report its own loops
        if isinstance(coordinator, ReportsFailing):  # the sharding watchdog and the like
            lines.extend(coordinator.failing())
        return "; ".join(lines) if lines else None

    async def _cluster_readiness(self) -> list[CheckLine]:
        statuses = self._cluster_statuses()
        return readiness_lines(statuses, self._engaged, self._ready_min_share, self._cluster_ready)

    def _observe_sync(self, name: str, cluster: Cluster) -> None:
        started = self._engage_started.get(name)
        if started is None or self._cluster_ready(name, cluster) is not None:
            return
        del self._engage_started[name]
        self.metrics.engage_duration.observe(time.monotonic() - started)
        self.freezer.synced()

    def __repr__(self) -> str:
        return f"<Manager clusters={sorted(self._engaged)} controllers={sorted(self.controllers)}>"

    @property
    def running(self) -> bool:
        """Between :meth:`start` and the end of its shutdown."""
        return self._running

    @property
    def has_provider(self) -> bool:
        return self.provider is not None

    def components(self) -> list[object]:
        """The runnables and awares added with :meth:`add` (controllers included), in order."""
        return list(dict.fromkeys([*self._runnables, *self._awares]))

    # --- components ---------------------------------------------------------------------

    def add(self, component: Controller | Runnable | Aware) -> None:
        """Register a controller, a runnable, or an aware; later additions start at once."""
        if isinstance(component, Controller):
            if component.name in self.controllers:
                raise ValueError(f"a controller named {component.name!r} is already registered")
            self.controllers[component.name] = component
            component.queue.set_metrics(self.metrics.queue_metrics(component.name))
            component.observers.append(self.metrics.observe_reconcile)
            component.tasks.crash_listeners.append(self._count_crash)
            if self.elector is not None:
                component.leader = self.elector
                component.write_check = self.elector.refusal
            if self.coordinator is not None:
                component.gate = self.work
                component.write_check = self.work.refusal
        if isinstance(component, Aware):
            self._awares.append(component)
        if isinstance(component, Runnable):
            self._runnables.append(component)
        if self._running:
            self._launch(component)

    def _launch(self, component: object) -> None:
        if isinstance(component, Runnable):
            task = asyncio.create_task(component.start(), name=f"runnable:{component!r}")
            self._tasks[component] = task
            self._watch.watch(task)  # a crash stops the manager, however late the component came
        if isinstance(component, Aware):
            for name, cluster in list(self._engaged.items()):
                key = (component, name)
                task = asyncio.create_task(component.engage(name, cluster), name=f"engage:{name}")
                self._tasks[key] = task
                task.add_done_callback(functools.partial(self._engage_done, key))

    def _engage_done(self, key: object, task: asyncio.Task[None]) -> None:
        """Forget a finished late engagement (the map must not grow with churn); report a failure."""
        if self._tasks.get(key) is task:
            del self._tasks[key]
        if not task.cancelled() and task.exception() is not None:
            log.error("engaging %r failed", key, exc_info=task.exception())

    # --- clusters -------------------------------------------------------------------------

    async def engage(self, name: str, cluster: Cluster) -> None:
        """Hand ``cluster`` to every component; idempotent for the same cluster object."""
        if self._engaged.get(name) is cluster:
            return
        self._engaged[name] = cluster
        if self.field_manager is not None and cluster.client.field_manager is None:
            cluster.client.field_manager = self.field_manager
        self._engage_started[name] = time.monotonic()
        self.metrics.cluster_engaged(name)
        self.freezer.engaging()

        def forget() -> None:
            if self._engaged.get(name) is cluster:
                del self._engaged[name]
                self._engage_started.pop(name, None)
                self.metrics.cluster_disengaged(name)
                self.freezer.stopped(len(self._engaged))
                for listener in self.disengage_listeners:
                    listener(name, cluster)

        cluster.on_stop(forget)
        cluster.tasks.crash_listeners.append(self._count_crash)
        for listener in self.engage_listeners:
            listener(name, cluster)
        results = await asyncio.gather(
            *(aware.engage(name, cluster) for aware in list(self._awares)), return_exceptions=True
        )
        for aware, result in zip(list(self._awares), results, strict=False):
            if isinstance(result, Exception):
                log.error("engaging cluster %r with %r failed", name, aware, exc_info=result)
        cluster.tasks.spawn(self._time_engagement(name, cluster), "engage-timer")

    async def _time_engagement(self, name: str, cluster: Cluster) -> None:
        # Polled, with a growing step: a fleet of 1,000 engaging at once must not wake
        # 10,000 times a second just to time itself (the histogram's buckets start at 0.1 s).
        # Past a second the step grows with the time waited (a tenth of it): a slow cold
        # start of 10,000 clusters would otherwise make 10,000 readiness checks a second
        # for minutes, and a tenth is all the precision a duration histogram needs.
        step = 0.05
        began = time.monotonic()
        while name in self._engage_started:
            self._observe_sync(name, cluster)
            await asyncio.sleep(step)
            step = min(step * 1.5, max(1.0, (time.monotonic() - began) / 10))

    async def get_cluster(self, name: str) -> Cluster:
        """An engaged cluster by name (``""`` is the local one); raises :class:`ClusterNotFound`."""
        found = self._engaged.get(name)
        if found is not None:
            return found
        if name != LOCAL_CLUSTER and self.provider is not None:
            return await self.provider.get(name)
        raise ClusterNotFound(name)

    def clusters(self) -> dict[str, Cluster]:
        """Every engaged cluster by name, the local one included (as ``""``)."""
        return dict(self._engaged)

    async def index_field(self, kind: Kind, name: str, extract: IndexFunc) -> None:
        """Index ``kind`` in the local cluster and in every provider cluster, now and later."""
        if self.local is not None:
            self.local.cache.index_field(kind, name, extract)
        if self.provider is not None:
            await self.provider.index_field(kind, name, extract)

    # --- running --------------------------------------------------------------------------

    def stop(self) -> None:
        """Ask a running manager to shut down gracefully (what SIGTERM does)."""
        self._stop.set()

    async def wait_started(self) -> None:
        """Wait until ``start`` has engaged the local cluster and started every component.

        Raises why ``start`` failed if it failed first (a port taken, a missing
        extra), instead of waiting forever for a start that will not come.
        """
        await self._latch.wait()

    async def start(self) -> None:
        """Run everything until :meth:`stop`, SIGTERM or SIGINT; then shut down gracefully.

        Shutdown stops intake, lets in-flight reconciles finish within
        ``graceful_shutdown_timeout`` (the webhook server serves meanwhile, as
        the pod leaves its Service), then closes the webhook server (its calls
        in flight get what is left of the timeout), stops the provider (which
        stops its clusters) and the local cluster, and leaves nothing running.
        """
        if self._running:
            raise RuntimeError("the manager is already running")
        self._running = True
        self._watch = RunWatch()
        self._latch.begin()
        raise_open_files_limit()  # a fleet needs an fd per connection: soft -> hard, as Go does
        self.freezer.started()
        restore = self._install_signal_handlers()
        provider_task: asyncio.Task[None] | None = None
        try:
            await self.endpoints.start(probes=self._probe_address, metrics=self._metrics_address)
            await self._start_webhook()
            if self._local_config is not None:
                # The hub keeps connections of its own: its Lease writes never wait their turn
                # behind member clusters that reach the same API server (see pool.py).
                options = dataclasses.replace(
                    self._cluster_options or ClusterOptions(), share_connections=False
                )
                self.local = Cluster(LOCAL_CLUSTER, self._local_config, options)
                await self.local.start()
                if self.elector is not None:
                    elector, local = self.elector, self.local
                    self._loops.supervise(lambda: elector.run(local), "leader-election")
            for component in [*self._runnables, *[a for a in self._awares if not isinstance(a, Runnable)]]:
                self._launch(component)
            if self.local is not None:
                await self.engage(LOCAL_CLUSTER, self.local)
            if self.coordinator is not None:
                coordinator = self.coordinator
                self._loops.supervise(lambda: coordinator.run(self), "coordinator")
            runner = _runnable_provider(self.provider)
            if runner is not None:
                provider_task = asyncio.create_task(runner.run(self), name="provider")
            self._started.set()
            await self._wait_for_stop(provider_task)
        except BaseException as error:
            self._latch.failed(error)  # before the shutdown: a waiter learns why at once
            raise
        finally:
            await self._shutdown(provider_task)
            restore()
            self._running = False
            self._latch.ended()

    async def _wait_for_stop(self, provider_task: asyncio.Task[None] | None) -> None:
        def returned(task: asyncio.Task[None]) -> None:
            if task is provider_task:  # its run() runs until cancelled: discovery ended in silence
                log.warning(PROVIDER_RETURNED, type(self.provider).__name__, len(self._engaged))

        if provider_task is not None:
            self._watch.watch(provider_task)
        await self._watch.until(self._stop, returned)

    async def _shutdown(self, provider_task: asyncio.Task[None] | None) -> None:
        grace = self.graceful_shutdown_timeout
        began = time.monotonic()
        drained = await asyncio.gather(
            *(controller.shutdown(grace) for controller in self.controllers.values()), return_exceptions=True
        )
        self.drained = all(result is True for result in drained)
        if not self.drained:
            log.warning("some reconciles did not finish within %.0fs and were cancelled", grace)
        if self._webhook is not None:  # before the clusters stop (see close_before_clusters)
            from .webhooks import close_before_clusters  # only a manager with webhooks needs it

            self.webhook_calls_cut = await close_before_clusters(self._webhook, self._awares, grace, began)
        for task in [*self._tasks.values(), *([provider_task] if provider_task else [])]:
            task.cancel()
        await asyncio.gather(
            *self._tasks.values(), *([provider_task] if provider_task else []), return_exceptions=True
        )
        self._tasks.clear()
        self.freezer.cancel()
        await self._loops.close()
        if self.local is not None:
            await self.local.stop()
        await self.endpoints.stop()

    def _install_signal_handlers(self) -> Callable[[], None]:
        return install_signal_handlers(self._on_signal) if self.handle_signals else lambda: None

    def _on_signal(self, signum: int) -> None:
        log.info("received %s; shutting down gracefully", signal.Signals(signum).name)
        self.stop()


def _runnable_provider(provider: object) -> ProviderRunnable | None:
    return provider if isinstance(provider, ProviderRunnable) else None


async def run_manager(manager: Manager, until: Awaitable[object]) -> None:
    """Run ``manager`` until ``until`` completes, then stop it (handy in tests and scripts)."""
    runner = asyncio.create_task(manager.start())
    try:
        await manager.wait_started()
        await until
    finally:
        manager.stop()
        await runner
