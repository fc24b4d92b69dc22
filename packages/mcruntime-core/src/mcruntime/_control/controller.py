"""Controllers: one work queue, per-cluster lanes of reconciles, and watches in every engaged cluster.

Work is isolated per cluster: each cluster gets a lane of at most
``max_concurrent_reconciles`` reconciles at once, and all lanes together share
at most ``max_total_reconciles``. A cluster whose API server hangs fills its
own lane and nothing else; the queue serves the other clusters in turn, up to
``keys_per_turn`` requests each.

``engage`` attaches the controller's sources to a cluster's shared informers and
returns at once: cache sync is waited for in the background, in a task owned by
the cluster, with a timeout, and a failure is reported for that cluster alone.
When the cluster stops, its handlers are removed and its queued requests purged,
so nothing is retried for a cluster that is gone. A controller created after
clusters were engaged is engaged with all of them by the manager.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .._base.backoff import DEFAULT_BACKOFF, Backoff
from .._base.errors import Unreachable
from .._base.tasks import TaskSet
from .._reconcile.context import enter_reconcile, leave_reconcile
from .._reconcile.fence import WriteCheck, enter_write_check, leave_write_check
from .._reconcile.request import ReconcileFunction, Request
from .gates import LeaderGate, RequestGate
from .longrun import LONG_RECONCILE_AFTER, watch_long_reconciles
from .outcomes import ParkedRequests, ReconcileStats, apply_failure, apply_result, log_cut_short
from .predicate import ObjectEvent, Predicate, describe_event, matches
from .ratelimit import RateLimiter, default_rate_limiter
from .source import Attachment, ChannelSource, KindSource
from .workqueue import QueueMetrics, QueueShutDown, WorkQueue

if TYPE_CHECKING:
    from .._fleet.cluster import Cluster

log = logging.getLogger("mcruntime.controller")


@dataclass
class _Engagement:
    cluster: Cluster
    attachments: list[tuple[KindSource, Attachment]] = field(default_factory=list)
    unregister: Callable[[], None] | None = None
    synced: bool = False
    sync_error: str | None = None


ReconcileObserver = Callable[[str, Request, str, float], None]


DEFAULT_MAX_TOTAL_RECONCILES = 256
"""The default bound on one controller's concurrent reconciles across all its clusters."""

DEFAULT_KEYS_PER_TURN = 32
"""The default number of requests one cluster is handed in a row when slots are scarce.

Requests sent to one API server together cost it less than the same requests
spread over every cluster in turn (S7, 4 reconciles at once: 1.7 to 2.0 ms of
API server CPU per patch against 3.4), and 32 in a row kept most of that gain
while a cluster waits at most 32 requests for each cluster ahead of it.
"""


class Controller:
    """Reconciles requests from its sources in one lane per cluster, under a global bound.

    ``max_concurrent_reconciles`` is the width of each cluster's lane: with the
    default 1, every cluster is reconciled as a single-cluster
    controller-runtime controller with one worker would reconcile it, and a
    cluster whose reconciles hang (its API server stopped answering) holds its
    own lane only. ``max_total_reconciles`` caps the reconciles running at
    once over all clusters, so a large fleet does not open thousands of
    requests together; when it is reached, clusters take turns for the free
    slots. Keep it above the number of clusters you expect to hang at once,
    or hung lanes can use it all up. ``keys_per_turn`` is how many requests
    a cluster is handed in a row before the next cluster's turn, when more
    clusters have work than there are free slots.
    """

    def __init__(
        self,
        name: str,
        reconcile: ReconcileFunction,
        *,
        max_concurrent_reconciles: int = 1,
        max_total_reconciles: int = DEFAULT_MAX_TOTAL_RECONCILES,
        keys_per_turn: int = DEFAULT_KEYS_PER_TURN,
        rate_limiter: RateLimiter | None = None,
        cache_sync_timeout: float = 60.0,
        event_filters: tuple[Predicate, ...] = (),
        has_provider: bool = False,
        queue_metrics: QueueMetrics | None = None,
    ) -> None:
        if max_concurrent_reconciles < 1:
            raise ValueError(
                f"controller {name!r}: max_concurrent_reconciles must be at least 1, "
                f"not {max_concurrent_reconciles}"
            )
        if max_total_reconciles < 1:
            raise ValueError(
                f"controller {name!r}: max_total_reconciles must be at least 1, not {max_total_reconciles}"
            )
        if keys_per_turn < 1:
            raise ValueError(f"controller {name!r}: keys_per_turn must be at least 1, not {keys_per_turn}")
        self.name = name
        self._reconcile = reconcile
        self.max_concurrent_reconciles = max_concurrent_reconciles
        self.max_total_reconciles = max_total_reconciles
        self.keys_per_turn = keys_per_turn
        self.queue: WorkQueue[Request] = WorkQueue(
            rate_limiter=rate_limiter or default_rate_limiter(),
            metrics=queue_metrics,
            group_limit=max_concurrent_reconciles,
            keys_per_turn=keys_per_turn,
        )
        self._slots = asyncio.Semaphore(max_total_reconciles)
        self.tasks: TaskSet = TaskSet(f"controller:{name}")
        self.dispatcher_backoff: Backoff = DEFAULT_BACKOFF
        """How long the dispatcher waits before it is restarted after dying (a test may shorten it)."""
        self.long_reconcile_after: float = LONG_RECONCILE_AFTER
        """Seconds after which a reconcile still running is logged, once (0: never); see ``longrun``."""
        self._cache_sync_timeout = cache_sync_timeout
        self._event_filters = event_filters
        self.has_provider = has_provider
        self._sources: list[KindSource] = []
        self._channels: list[ChannelSource] = []
        self._engaged: dict[str, _Engagement] = {}
        self._dispatcher: asyncio.Task[None] | None = None
        self._waiting_worker: asyncio.Task[None] | None = None  # see _linger
        self._inflight: set[asyncio.Task[None]] = set()
        self._readers: list[asyncio.Task[None]] = []
        self._started = False
        self.stats: ReconcileStats = ReconcileStats()
        self.observers: list[ReconcileObserver] = []
        self.active_workers: int = 0
        self.leader: LeaderGate | None = None
        self.gate: RequestGate | None = None
        # Asked by the client before each write a reconcile sends (see _reconcile/fence.py).
        self.write_check: WriteCheck | None = None
        self._current: dict[asyncio.Task[None], Request] = {}
        self._revoked: set[asyncio.Task[None]] = set()
        self._released: list[tuple[str, asyncio.Future[None]]] = []
        # Requests that failed because a cluster does not answer, by that cluster: they
        # wait for its health probe to get an answer instead of burning their backoff.
        self._parked = ParkedRequests(name, self._add)

    def __repr__(self) -> str:
        return f"<Controller {self.name!r} clusters={sorted(self._engaged)}>"

    # --- wiring -----------------------------------------------------------------------

    def watch(self, source: KindSource | ChannelSource) -> None:
        """Add a source; a kind source is attached to every cluster already engaged."""
        if isinstance(source, ChannelSource):
            self._channels.append(source)
            if self._started:
                self._readers.append(self._supervise_reader(source))
            return
        self._sources.append(source)
        for cluster_name, engagement in self._engaged.items():
            self._attach(cluster_name, engagement, [source])

    @property
    def sources(self) -> list[KindSource]:
        return list(self._sources)

    @property
    def channels(self) -> list[ChannelSource]:
        """The channel sources (requests sent by the program itself rather than watched)."""
        return list(self._channels)

    # --- clusters -----------------------------------------------------------------------

    async def engage(self, name: str, cluster: Cluster) -> None:
        """Start watching ``cluster`` under ``name``; returns without waiting for sync.

        Idempotent for the same cluster object; a different object under the same
        name replaces the old engagement (its handlers go, its queued requests are
        purged first).
        """
        current = self._engaged.get(name)
        if current is not None and current.cluster is cluster:
            return
        if current is not None:
            self._disengage(name, current.cluster)
        if cluster.stopped:
            return
        engagement = _Engagement(cluster)
        self._engaged[name] = engagement
        engagement.unregister = cluster.on_stop(lambda: self._disengage(name, cluster))
        self._attach(name, engagement, self._sources)

    def _attach(self, name: str, engagement: _Engagement, sources: list[KindSource]) -> None:
        fresh = []
        for source in sources:
            if not source.clusters.includes(name, has_provider=self.has_provider):
                continue
            source.handler.bind_cluster(name, engagement.cluster)  # owner scope, say, from discovery
            attachment = source.attach(name, engagement.cluster, self._sink(source))
            engagement.attachments.append((source, attachment))
            fresh.append(attachment)
        if fresh:
            engagement.synced = False
            engagement.cluster.tasks.spawn(self._await_sync(name, engagement, fresh), f"sync:{self.name}")

    async def _await_sync(self, name: str, engagement: _Engagement, attachments: list[Attachment]) -> None:
        timeout = self._cache_sync_timeout
        results = await asyncio.gather(*(attachment.settle(timeout) for attachment in attachments))
        if all(results):
            engagement.synced = True
            engagement.sync_error = None
            return
        engagement.sync_error = f"cache did not sync within {self._cache_sync_timeout:.0f}s"
        errors = {a.informer.stats.last_error for a in attachments if a.informer.stats.last_error}
        log.warning(
            "controller %s: cluster %r %s%s; its informers keep retrying",
            self.name,
            name,
            engagement.sync_error,
            f" ({'; '.join(sorted(errors))})" if errors else "",
        )
        await asyncio.gather(*(attachment.settle(None) for attachment in attachments))
        engagement.synced, engagement.sync_error = True, None  # late (a permission granted): ready after all
        log.info("controller %s: cluster %r synced late; its reconciles are ready", self.name, name)

    def _disengage(self, name: str, cluster: Cluster) -> None:
        engagement = self._engaged.get(name)
        if engagement is None or engagement.cluster is not cluster:
            return  # an old instance's stop must never remove its replacement
        del self._engaged[name]
        for _source, attachment in engagement.attachments:
            attachment.detach()
        if engagement.unregister is not None:
            engagement.unregister()
        purged = self.queue.purge(name)
        self._parked.drop(name)
        log.info("controller %s: disengaged cluster %r (%d queued requests dropped)", self.name, name, purged)

    def engaged(self) -> dict[str, Cluster]:
        """The clusters this controller is engaged with, by name."""
        return {name: engagement.cluster for name, engagement in self._engaged.items()}

    def synced(self, name: str) -> bool:
        """Whether every informer this controller uses in ``name`` has synced."""
        engagement = self._engaged.get(name)
        return engagement is not None and (engagement.synced or not engagement.attachments)

    # --- events ---------------------------------------------------------------------------

    def _sink(self, source: KindSource) -> Callable[[ObjectEvent], None]:
        return lambda event: self._dispatch(source, event)

    def _dispatch(self, source: KindSource | ChannelSource, event: ObjectEvent) -> None:
        if not matches(source.predicates, event) or not matches(self._event_filters, event):
            return
        try:
            for request in source.handler.requests(event):
                self._add(request)
        except Exception:  # a map function's bug: the event is lost, so say whose and which
            log.exception("controller %s: %r failed on %s", self.name, source.handler, describe_event(event))

    def _add(self, request: Request) -> None:
        if self.gate is None or self.gate.admits(request.cluster):
            self.queue.add(request)

    def _supervise_reader(self, source: ChannelSource) -> asyncio.Task[None]:
        index = self._channels.index(source)
        return self.tasks.supervise(
            lambda: self._read_channel(source), f"channel-{index}", backoff=self.dispatcher_backoff
        )

    async def _read_channel(self, source: ChannelSource) -> None:
        while True:
            item = await source.channel.get()
            if isinstance(item, Request):
                self._add(item)
            else:
                self._dispatch(source, item)

    # --- work per cluster (sharding) ------------------------------------------------------

    def replay(self, clusters: set[str]) -> None:
        """Enqueue, as creations, what the caches hold for requests in ``clusters``.

        Events for clusters the gate did not admit were dropped; when a cluster
        is admitted, this is how its work starts from warm caches. Handlers that
        only ever name their own cluster are replayed from those clusters alone;
        a mapping handler is replayed from every cluster, since any event may
        map into ``clusters``.
        """
        for name, engagement in self._engaged.items():
            for source, attachment in engagement.attachments:
                if name not in clusters and source.handler.same_cluster:
                    continue
                for obj in attachment.informer.list():
                    if not attachment.wanted(obj):
                        continue
                    event = ObjectEvent("create", name, obj)
                    if not matches(source.predicates, event) or not matches(self._event_filters, event):
                        continue
                    for request in source.handler.requests(event):
                        if request.cluster in clusters:
                            self.queue.add(request)

    async def release(self, cluster: str, grace: float = 0.0) -> None:
        """Stop working on ``cluster``: drop its queued requests, end its in-flight reconciles.

        In-flight reconciles get ``grace`` seconds, then are cancelled; either
        way their requests are dropped, not retried here: another replica owns
        the cluster now. Returns once none of them is running. The caller must
        already have shut the gate for ``cluster``, or requests come back.
        """
        self.queue.purge(cluster)
        self._parked.drop(cluster)
        if not self._running_in(cluster):
            return
        finished: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._released.append((cluster, finished))
        if grace > 0:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(grace):
                    await asyncio.shield(finished)
        for worker, request in list(self._current.items()):
            if request.cluster == cluster:
                self._revoked.add(worker)
                worker.cancel()
        await finished

    def _running_in(self, cluster: str) -> bool:
        return any(request.cluster == cluster for request in self._current.values())

    def _notify_released(self) -> None:
        for entry in list(self._released):
            cluster, finished = entry
            if not self._running_in(cluster):
                self._released.remove(entry)
                if not finished.done():
                    finished.set_result(None)

    # --- workers ---------------------------------------------------------------------------

    async def start(self) -> None:
        """Run the dispatcher until :meth:`shutdown` (or cancellation).

        The dispatcher takes a global slot, then the next request the queue
        gives (round robin over clusters whose lanes have room), and runs the
        reconcile in a task of its own. It is a supervised loop: should it ever
        die, that is logged and it is started again.

        With a leader gate, reconciles run only while this replica leads:
        losing leadership cancels them at once (in-flight requests go back to
        the queue) and they start again when leadership returns; the caches
        stay warm throughout.
        """
        if self._started:
            raise RuntimeError(f"controller {self.name!r} is already running")
        self._started = True
        self._readers = [self._supervise_reader(source) for source in self._channels]

        async def watch() -> None:
            after, lanes = (lambda: self.long_reconcile_after), self.max_concurrent_reconciles
            await watch_long_reconciles(self.name, self.queue.processing, after, lanes)

        self._readers.append(self.tasks.supervise(watch, "long-reconciles"))  # ends with the readers
        try:
            while not self._stopping():
                if self.leader is not None:
                    await self.leader.wait_elected()
                if self._stopping():
                    break
                dispatcher = self._dispatcher = self.tasks.supervise(
                    self._dispatch_loop, "dispatcher", backoff=self.dispatcher_backoff
                )
                if self.leader is None:
                    await asyncio.wait([dispatcher])  # shutdown may cancel it: that is an end too
                    await self._wait_inflight()
                    break
                lost: asyncio.Future[None] = asyncio.ensure_future(self.leader.wait_lost())
                either: list[asyncio.Future[Any]] = [dispatcher, lost]
                await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
                if dispatcher.done():
                    lost.cancel()
                    await self._wait_inflight()
                    break
                log.warning(
                    "controller %s: lost leadership; stopping its reconciles until it leads again", self.name
                )
                await self._cancel_all(readers=False)
        finally:
            await self._cancel_all()

    def _stopping(self) -> bool:
        return self.queue.shutting_down

    async def _wait_inflight(self) -> None:
        while self._inflight:
            await asyncio.gather(*self._inflight, return_exceptions=True)

    async def _cancel_all(self, *, readers: bool = True) -> None:
        tasks = [*self._inflight, *self._readers] if readers else [*self._inflight]
        if self._dispatcher is not None:
            tasks.append(self._dispatcher)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def shutdown(self, grace: float = 30.0) -> bool:
        """Stop intake, let in-flight reconciles finish within ``grace``, then stop the rest.

        Returns whether everything in flight finished in time.
        """
        self.queue.shut_down()
        for reader in self._readers:
            reader.cancel()
        drained = await self.queue.shut_down_with_drain(grace)
        if not drained and self._current:
            log_cut_short(self.name, list(self._current.values()), grace)
        await self._cancel_all()
        return drained

    async def _dispatch_loop(self) -> None:
        """Take a global slot, then a request, and start its reconcile; until the queue shuts down."""
        while True:
            await self._slots.acquire()
            request: Request | None = None
            started = False
            try:
                try:
                    request = await self.queue.get()
                except QueueShutDown:
                    return
                if not self._admitted(request):
                    continue
                task = asyncio.create_task(self._run(request), name=f"controller:{self.name}:reconciles")
                self._current[task] = request
                self._inflight.add(task)
                self.active_workers += 1
                started = True
            except Exception:
                if request is not None:  # never lose a request we took, whatever failed
                    self.queue.add_rate_limited(request)
                raise
            finally:
                if not started:
                    self._slots.release()
                    if request is not None:
                        self.queue.done(request)

    async def _run(self, request: Request) -> None:
        """Reconcile ``request``, then each request ready next, in this task; give back the slot at the end.

        Going on with the next ready request in the same task, instead of a
        task per request, saves creating and scheduling one per reconcile
        (about 5 us, a tenth of what an object of a cold start costs). The
        queue still decides what comes next (lanes, their limits, the round
        robin over clusters), so fairness is unchanged.

        When nothing is ready, one worker of the controller stays, its slot in
        hand, and waits for the next request ahead of the dispatcher (see
        :meth:`_linger`); any other worker ends. A controller whose events come
        one at a time (a steady trickle over a fleet) so starts each reconcile
        where the request lands, instead of waking the dispatcher to create a
        task that starts one loop iteration later. The task ends when intake
        stops, when it is cancelled, or when another worker already waits.
        """
        worker = asyncio.current_task()
        assert worker is not None
        working = True
        try:
            current: Request | None = request
            while current is not None:
                if not await self._run_one(worker, current):
                    return
                current = self._next_for(worker)
                if current is None and self._waiting_worker is None and not self._winding_down(worker):
                    working = False
                    self.active_workers -= 1
                    current = await self._linger(worker)
                    self.active_workers += 1
                    working = True
        finally:
            self._inflight.discard(worker)
            if working:
                self.active_workers -= 1
            self._slots.release()

    async def _linger(self, worker: asyncio.Task[None]) -> Request | None:
        """Wait, as the controller's one waiting worker, for the next request this replica may run.

        Ahead of the dispatcher in the queue's line (it holds a slot of its own
        while it waits): the next ready request comes here, and the dispatcher
        starts a task only for the requests that arrive while this worker is
        busy. ``None`` when intake stops, the worker's end.
        """
        self._waiting_worker = worker
        try:
            while True:
                try:
                    request = await self.queue.get(ahead=True)
                except QueueShutDown:
                    return None
                if self._admitted(request):
                    self._current[worker] = request
                    return request
                self.queue.done(request)
        finally:
            self._waiting_worker = None

    def _winding_down(self, worker: asyncio.Task[None]) -> bool:
        return worker.cancelling() > 0 or self.queue.shutting_down

    async def _run_one(self, worker: asyncio.Task[None], request: Request) -> bool:
        """One reconcile; always gives back its request. False: the worker was cancelled, stop."""
        try:
            await self._reconcile_one(request)
        except asyncio.CancelledError:
            if worker not in self._revoked:
                self.queue.add(request)  # interrupted (leadership lost, shutdown): do it again later
                raise
            # Its cluster was released: drop the request; the lanes of the others go on.
            self.queue.forget(request)
            return False
        except Exception:
            # _reconcile_one handles the reconciler's own errors; this is a bug in ours.
            log.exception("controller %s: handling %s failed; retrying it", self.name, request)
            self.queue.add_rate_limited(request)
        finally:
            self._revoked.discard(worker)
            self._current.pop(worker, None)
            self.queue.done(request)
            if self._released:
                self._notify_released()
        return True

    def _next_for(self, worker: asyncio.Task[None]) -> Request | None:
        """The next ready request this worker may take, now; ``None`` ends the worker."""
        if self._winding_down(worker):
            return None  # a cancel the reconcile swallowed, or a shutdown: the dispatcher decides
        while (request := self.queue.get_nowait()) is not None:
            if self._admitted(request):
                self._current[worker] = request
                return request
            self.queue.done(request)
        return None

    def _admitted(self, request: Request) -> bool:
        """Whether this replica may run ``request``; one queued before its cluster moved away is forgotten."""
        if self.gate is None or self.gate.admits(request.cluster):
            return True
        self.queue.forget(request)
        return False

    async def _reconcile_one(self, request: Request) -> None:
        token = enter_reconcile(self.name, request)
        guard = enter_write_check(self.write_check)
        started, engaged = time.monotonic(), self._engaged.get(request.cluster)
        try:
            result = await self._reconcile(request)
        except Exception as error:
            left = engaged is not None and self._engaged.get(request.cluster) is not engaged
            outcome = apply_failure(self.name, self.queue, self.stats, request, error, self._park, left=left)
        else:
            outcome = apply_result(self.name, self.queue, self.stats, request, result)
        finally:
            leave_write_check(guard)
            leave_reconcile(token)
        elapsed = time.monotonic() - started
        for observer in self.observers:
            try:
                observer(self.name, request, outcome, elapsed)
            except Exception:
                log.exception("controller %s: reconcile observer %r failed", self.name, observer)

    def _park(self, request: Request, error: Unreachable) -> bool:
        """Hold ``request`` until the cluster that did not answer answers again.

        Only while that cluster's circuit is open (its probe gets no answer):
        retrying sooner would fail at once, and retrying on the rate limiter
        would leave the request minutes behind once the cluster is back. The
        request goes back to the queue, its backoff forgotten, when the probe
        gets an answer. Returns False when the cluster is not known unreachable.
        """
        name = error.cluster if error.cluster in self._engaged else request.cluster
        engagement = self._engaged.get(name)
        if engagement is None or not self._parked.park(name, engagement.cluster, request):
            return False
        self.queue.forget(request)
        return True
