"""Prometheus metrics for one manager, in a registry of its own.

Names follow controller-runtime (``controller_runtime_reconcile_total``,
``workqueue_depth``, ...) so existing dashboards work, with a ``cluster`` label
where it applies. Fleet metrics are mcruntime's own (``mcruntime_*``): how many
clusters are engaged in which state, how long engaging and cache syncs take,
watch restarts and relists, and when each cluster last failed: what
multicluster-runtime users asked for and had to build themselves.

Counters and histograms are updated as things happen; everything that is a
property of live objects (queue depths, informer counters, cluster states) is
read at scrape time by a collector, so nothing goes stale when a cluster leaves.

Churn must not grow the registry: a fleet sees thousands of cluster names come
and go over months. So a series labelled with a cluster exists only while that
cluster is engaged. Every such series is made through :meth:`ManagerMetrics.child`,
which records it; :meth:`ManagerMetrics.cluster_disengaged` removes them all, and
an observation that arrives after its cluster left (a reconcile that finished
late) is dropped instead of bringing a series back that nobody would remove.
Fleet-wide counts (engagements, disengagements) carry no cluster label.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Hashable, Iterable, Iterator
from typing import TYPE_CHECKING, Any, TypeVar

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from .._base.metric import Metrics
from .._client.health import HealthState
from .._reconcile.request import Request
from .hot_series import CounterFamily, HistogramFamily

if TYPE_CHECKING:
    from .._control.controller import Controller
    from .._coordination.leaderelection import LeaderElector
    from .._fleet.cluster import Cluster

_F = TypeVar("_F", CounterFamily, HistogramFamily)

_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


def _cluster_label(group: Hashable) -> str:
    return str(group) if group else "local"


def cluster_health(name: str, cluster: Cluster, states: dict[str, str]) -> tuple[str, bool]:
    """A cluster's state (engaging, ready, unhealthy) and whether it is healthy, from its one health record.

    The record ``statuses()`` and ``/readyz`` read: a cluster is unhealthy
    when its probe fails, when a permission it needs is missing, when one of
    its loops or informers is failing, not only when its probe got a bad answer. The
    provider's state (from ``statuses()``) is taken as it is, except that it
    never says ready for a cluster with such trouble; a cluster the provider
    does not report (the local one) is judged as ``ClusterSet`` judges its own.
    """
    health = cluster.health
    unknown = health.state is HealthState.UNKNOWN
    trouble = health.state is HealthState.UNHEALTHY or cluster.trouble() is not None
    state = states.get(name)
    if state is None:  # ClusterSet's order: a failing probe, no answer yet, then the rest
        state = "engaging" if unknown else "unhealthy" if trouble else "ready"
    elif state == "ready" and trouble:
        state = "unhealthy"
    return state, health.healthy and not trouble and state != "unhealthy"


class _Discarded:
    """Stands in for the series of a cluster that is not engaged: observations go nowhere."""

    def inc(self, amount: float = 1.0) -> None:
        del amount

    def observe(self, amount: float) -> None:
        del amount


_DISCARDED = _Discarded()


class _QueueMetrics:
    """The work queue's hook for one controller."""

    def __init__(self, metrics: ManagerMetrics, controller: str) -> None:
        self._metrics = metrics
        self._controller = controller

        self._latency = metrics.queue_latency.labels(controller, controller)
        self._duration = metrics.work_duration.labels(controller, controller)

    def on_add(self, key: Hashable, group: Hashable) -> None:
        name = self._controller
        self._metrics.child(self._metrics.queue_adds, name, name, _cluster_label(group)).inc()

    def on_get(self, key: Hashable, group: Hashable, waited: float) -> None:
        self._latency.observe(waited)

    def on_done(self, key: Hashable, group: Hashable, processing: float) -> None:
        self._duration.observe(processing)

    def on_retry(self, key: Hashable, group: Hashable) -> None:
        name = self._controller
        self._metrics.child(self._metrics.queue_retries, name, name, _cluster_label(group)).inc()


class ManagerMetrics:
    """Every metric of one manager; ``registry`` is what the metrics endpoint serves."""

    def __init__(
        self,
        controllers: Callable[[], Iterable[Controller]],
        clusters: Callable[[], dict[str, Cluster]],
        states: Callable[[], dict[str, str]],
        elector: LeaderElector | None = None,
    ) -> None:
        self.registry: CollectorRegistry = CollectorRegistry(auto_describe=True)
        registry = self.registry
        self._children: dict[tuple[Any, tuple[str, ...]], Any] = {}
        # Cluster labels engaged now (the only ones with series), each with its series' keys,
        # so forgetting a cluster costs its own series, not a scan of the whole fleet's.
        self._live: dict[str, list[tuple[Any, tuple[str, ...]]]] = {}
        metric = Metrics(registry)
        # The series every event touches are plain numbers read at scrape time (hot_series.py).
        self.reconcile_total: CounterFamily = self._hot(
            CounterFamily(
                "controller_runtime_reconcile_total",
                "Reconciles per controller, result and cluster.",
                ("controller", "result", "cluster"),
            )
        )
        self.reconcile_errors: CounterFamily = self._hot(
            CounterFamily(
                "controller_runtime_reconcile_errors_total",
                "Reconciles that raised, per controller and cluster.",
                ("controller", "cluster"),
            )
        )
        self.terminal_errors: CounterFamily = self._hot(
            CounterFamily(
                "controller_runtime_terminal_reconcile_errors_total",
                "Reconciles that raised TerminalError, per controller and cluster.",
                ("controller", "cluster"),
            )
        )
        self.reconcile_time: HistogramFamily = self._hot(
            HistogramFamily(
                "controller_runtime_reconcile_time_seconds",
                "How long reconciles take, per controller and cluster.",
                ("controller", "cluster"),
                buckets=_BUCKETS,
            )
        )
        queue = ("name", "controller")
        self.queue_adds: CounterFamily = self._hot(
            CounterFamily("workqueue_adds_total", "Adds to the work queue.", (*queue, "cluster"))
        )
        self.queue_retries: Counter = metric.counter(
            "workqueue_retries_total", "Rate-limited re-adds.", (*queue, "cluster")
        )
        self.queue_latency: HistogramFamily = self._hot(
            HistogramFamily(
                "workqueue_queue_duration_seconds",
                "How long a request waits in the queue before a worker takes it.",
                queue,
                buckets=_BUCKETS,
            )
        )
        self.work_duration: HistogramFamily = self._hot(
            HistogramFamily(
                "workqueue_work_duration_seconds",
                "How long a worker holds a request.",
                queue,
                buckets=_BUCKETS,
            )
        )
        self.engage_duration: Histogram = metric.histogram(
            "mcruntime_cluster_engage_duration_seconds",
            "From engaging a cluster to every controller's caches being synced in it.",
            buckets=_BUCKETS,
        )
        # Fleet-wide: a per-cluster count of departures could never be removed, so would grow with churn.
        self.engagements: Counter = metric.counter(
            "mcruntime_cluster_engagements_total",
            "Clusters engaged (a replaced cluster counts again), fleet-wide.",
        )
        self.disengagements: Counter = metric.counter(
            "mcruntime_cluster_disengagements_total",
            "Clusters disengaged (removed, replaced or stopped), fleet-wide.",
        )
        self.loop_crashes: Counter = metric.counter(
            "mcruntime_loop_crashes_total",
            "Long-lived loops (informers, health probes, leader election, ...) that died and were restarted.",
            ("loop",),
        )
        registry.register(_LiveCollector(controllers, clusters, states, elector))

    def _hot(self, family: _F) -> _F:
        self.registry.register(family)
        return family

    def child(self, metric: Any, *values: str) -> Any:
        """``metric.labels(*values)``, cached; the last value must be the cluster's label.

        Every series with a cluster label is made here, so that
        :meth:`forget_cluster` can find and remove it. A cluster that is not
        engaged gets a stand-in that records nothing. The cache is also what
        makes this cheap: prometheus_client's lookup costs about a
        microsecond per call, and a reconcile makes several.
        """
        key = (metric, values)
        found = self._children.get(key)
        if found is None:
            keys = self._live.get(values[-1])
            if keys is None:
                return _DISCARDED
            found = self._children[key] = metric.labels(*values)
            keys.append(key)
        return found

    def cluster_engaged(self, cluster: str) -> None:
        """Count an engagement; the cluster's series may exist from now on."""
        self._live.setdefault(_cluster_label(cluster), [])
        self.engagements.inc()

    def cluster_disengaged(self, cluster: str) -> None:
        """Count a disengagement and remove every series of the cluster."""
        self.disengagements.inc()
        self.forget_cluster(cluster)

    def forget_cluster(self, cluster: str) -> None:
        """Remove every series labelled with ``cluster``; later observations for it are dropped."""
        for key in self._live.pop(_cluster_label(cluster), []):
            metric, values = key
            self._children.pop(key, None)
            with contextlib.suppress(KeyError):
                metric.remove(*values)

    def queue_metrics(self, controller: str) -> _QueueMetrics:
        """The hook to give a controller's work queue."""
        return _QueueMetrics(self, controller)

    def observe_reconcile(self, controller: str, request: Request, outcome: str, seconds: float) -> None:
        """Record one reconcile.

        ``outcome`` is success, error, terminal, requeue, requeue_after or dropped.
        """
        cluster = _cluster_label(request.cluster)
        self.child(self.reconcile_total, controller, outcome, cluster).inc()
        if outcome == "error":
            self.child(self.reconcile_errors, controller, cluster).inc()
        elif outcome == "terminal":
            self.child(self.terminal_errors, controller, cluster).inc()
        self.child(self.reconcile_time, controller, cluster).observe(seconds)


class _LiveCollector(Collector):
    """Reads live state at scrape time."""

    def __init__(
        self,
        controllers: Callable[[], Iterable[Controller]],
        clusters: Callable[[], dict[str, Cluster]],
        states: Callable[[], dict[str, str]],
        elector: LeaderElector | None = None,
    ) -> None:
        self._controllers = controllers
        self._clusters = clusters
        self._states = states
        self._elector = elector

    def collect(self) -> Iterator[Metric]:
        yield from self._controller_metrics()
        yield from self._fleet_metrics()
        if self._elector is not None:
            yield self._leader_status(self._elector)

    @staticmethod
    def _leader_status(elector: LeaderElector) -> Metric:
        """controller-runtime's ``leader_election_master_status{name}``: 1 while leading, 0 on standby."""
        status = GaugeMetricFamily(
            "leader_election_master_status",
            "1 while this replica leads the election of the Lease 'name', 0 while it stands by.",
            labels=["name"],
        )
        status.add_metric([elector.config.name], 1.0 if elector.leading.is_set() else 0.0)
        return status

    def _controller_metrics(self) -> Iterator[Metric]:
        workers = GaugeMetricFamily(
            "controller_runtime_active_workers", "Workers busy now.", labels=["controller"]
        )
        limit = GaugeMetricFamily(
            "controller_runtime_max_concurrent_reconciles",
            "Concurrent reconciles allowed per cluster (the lane width).",
            labels=["controller"],
        )
        depth = GaugeMetricFamily(
            "workqueue_depth", "Requests waiting.", labels=["name", "controller", "cluster"]
        )
        unfinished = GaugeMetricFamily(
            "workqueue_unfinished_work_seconds",
            "Age of the oldest request a worker holds.",
            labels=["name", "controller"],
        )
        longest = GaugeMetricFamily(
            "workqueue_longest_running_processor_seconds",
            "How long the longest-running worker has been busy.",
            labels=["name", "controller"],
        )
        for controller in self._controllers():
            name = controller.name
            workers.add_metric([name], controller.active_workers)
            limit.add_metric([name], controller.max_concurrent_reconciles)
            # Every engaged cluster has a depth, 0 when its queue is empty, as
            # controller-runtime exports it: a series that vanishes reads as "no data".
            depths = {_cluster_label(cluster): 0 for cluster in controller.engaged()}
            for group, count in controller.queue.depth_by_group().items():
                depths[_cluster_label(group)] = count
            for cluster_label, count in sorted(depths.items()):
                depth.add_metric([name, name, cluster_label], count)
            oldest = controller.queue.longest_processing_seconds()
            unfinished.add_metric([name, name], oldest)
            longest.add_metric([name, name], oldest)
        yield from (workers, limit, depth, unfinished, longest)

    def _fleet_metrics(self) -> Iterator[Metric]:
        clusters = self._clusters()
        states = self._states()
        by_state = GaugeMetricFamily(
            "mcruntime_engaged_clusters", "Engaged clusters by state.", labels=["state"]
        )
        counts: dict[str, int] = {"engaging": 0, "ready": 0, "unhealthy": 0}
        judged = {name: cluster_health(name, cluster, states) for name, cluster in clusters.items()}
        for state, _healthy in judged.values():
            counts[state] = counts.get(state, 0) + 1
        for state, count in sorted(counts.items()):
            by_state.add_metric([state], count)
        yield by_state
        last_error = GaugeMetricFamily(
            "mcruntime_cluster_last_error_timestamp_seconds",
            "Unix time of the last failure talking to each cluster.",
            labels=["cluster"],
        )
        healthy = GaugeMetricFamily(
            "mcruntime_cluster_healthy",
            "1 when the cluster is healthy as statuses() and /readyz say: its health probe got a good "
            "answer, no permission it needs is missing and none of its loops is failing.",
            labels=["cluster"],
        )
        relists = CounterMetricFamily(
            "mcruntime_informer_relists",
            "Lists after the first, per cluster and kind.",
            labels=["cluster", "kind"],
        )
        restarts = CounterMetricFamily(
            "mcruntime_informer_watch_restarts",
            "Watch reconnects, per cluster and kind.",
            labels=["cluster", "kind"],
        )
        sync = GaugeMetricFamily(
            "mcruntime_cache_sync_duration_seconds",
            "How long each informer took to fill its store the first time.",
            labels=["cluster", "kind"],
        )
        failing = GaugeMetricFamily(
            "mcruntime_informer_failing",
            "1 while every list or watch of the kind fails since the last that worked (its store is stale).",
            labels=["cluster", "kind"],
        )
        for name, cluster in sorted(clusters.items()):
            label = _cluster_label(name)
            health = cluster.health
            healthy.add_metric([label], 1.0 if judged[name][1] else 0.0)
            if health.last_error_at is not None:
                last_error.add_metric([label], health.last_error_at)
            # One series per kind: a kind may have several informers (scopes, a metadata view).
            per_kind: dict[str, tuple[int, int, float | None, bool]] = {}
            for informer in cluster.cache.informers():
                kind = str(informer.kind)
                stats = informer.stats
                lists, watches, seconds, stale = per_kind.get(kind, (0, 0, None, False))
                if stats.sync_seconds is not None:
                    seconds = max(seconds or 0.0, stats.sync_seconds)
                stale = stale or informer.broken is not None  # an optional kind missing is not
                per_kind[kind] = (lists + stats.relists, watches + stats.watch_restarts, seconds, stale)
            for kind, (lists, watches, seconds, stale) in sorted(per_kind.items()):
                relists.add_metric([label, kind], lists)
                restarts.add_metric([label, kind], watches)
                failing.add_metric([label, kind], 1.0 if stale else 0.0)
                if seconds is not None:
                    sync.add_metric([label, kind], seconds)
        yield from (healthy, last_error, relists, restarts, sync, failing)
