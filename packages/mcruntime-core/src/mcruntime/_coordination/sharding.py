"""Sharding the fleet across replicas with Leases on the hub, at a write rate set by the replicas.

Liveness is per replica, fencing is per shard of the fleet, work is per
cluster, and only liveness is renewed.

- **Peer Leases.** Each replica holds one Lease (``<group>-peer-<hash>``) and
  renews it every ``retry_period``, from a thread of its own so that a busy
  event loop cannot delay it (see heartbeat.py): the group's only steady-state writes, so
  the hub sees ``replicas / retry_period`` writes per second however many
  clusters there are. A peer whose Lease this replica has watched unchanged
  for ``lease_duration`` (on its own monotonic clock: clocks are never
  compared) has dropped out.
- **Shards.** Each cluster falls in one of ``shards`` shards by a hash of
  its name; clusters move between replicas a shard at a time.
- **Ownership.** Every replica computes the same owner for every shard by
  weighted rendezvous hashing over the live peers, so when a peer goes only its
  shards move, and a new peer takes about ``1/n`` from everyone.
- **Fences.** A replica works on a cluster only while it holds the fence
  Lease of the cluster's shard (``<group>-fence-<shards>-<shard>``), which
  names its holder and is written only when it changes hands: acquired
  (optimistic concurrency on ``resourceVersion``, so of two contenders
  exactly one wins) and released or deleted. A failover or handover writes
  one fence per shard that moves, however many clusters the shards hold. A
  fence stays valid, unrenewed, for as long as its holder's peer Lease is
  live. It may be taken when it is free (released), or when its
  holder has shown no sign of life (peer Lease renewal, or deletion) for a full
  ``lease_duration`` as observed here, or its peer Lease is still at a version
  a peer names as watched silent for a full term (see membership.py),
  confirmed by a fresh read of the holder's peer Lease just before the write.
- **Stopping in time.** A replica that has not renewed its own peer Lease
  for ``renew_deadline`` stops all its work at once (a watchdog, not the
  round, enforces it), and only writes fences again after renewing. Since
  ``renew_deadline < lease_duration`` and every observer's clock starts no
  earlier than the renewal it saw, the holder has stopped before anyone may
  take its fences. A partitioned replica therefore goes quiet before the
  others move its clusters.

Failover after a crash takes ``lease_duration`` plus at most one
``retry_period``; a graceful handover (a replica joins or leaves) is
immediate: the old owner stops the cluster's work (in-flight reconciles get
``handover_grace``), releases the fence, and the new owner, woken by the
release, takes it. Each shard's fence, and therefore its clusters' work, keeps
its own lifetime: losing one shard never waits on another.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from typing import TYPE_CHECKING

from .._base.backoff import DEFAULT_BACKOFF, Backoff
from .._base.objects import JSON
from .._base.tasks import TaskSet
from .._cache.informer import ResourceEventHandler
from .fences import Fences
from .heartbeat import Connect, Heartbeat, own_connection
from .lease import LEASE, holder_of, renew_time_of
from .membership import Membership
from .rendezvous import Shares
from .shardhub import (
    API_ERRORS,
    CONCURRENT_WRITES,
    GROUP_LABEL,
    ROLE_LABEL,
    SHARD_ANNOTATION,
    SHARDS_ANNOTATION,
    SILENT_ANNOTATION,
    WEIGHT_ANNOTATION,
    HubWrites,
    ShardingConfig,
    ShardMetrics,
)
from .shardlog import GroupLog
from .shardmap import ShardMap

if TYPE_CHECKING:
    from .._client.client import Client
    from .._fleet.cluster import Cluster
    from .coordinator import Seat

__all__ = ["ShardedCoordinator", "ShardingConfig"]

log = logging.getLogger("mcruntime.sharding")


class ShardedCoordinator:
    """Splits the engaged clusters between replicas; pass it as ``Manager(coordinator=...)``.

    Every replica keeps its providers and caches running for every cluster
    (warm standby): ownership changes only open and close work. ``backoff``
    paces retries after a round fails unexpectedly (a Lease kind the hub does
    not serve, a garbled answer); the loop never gives up. This class is the
    round; who is in the group is :class:`Membership`, which clusters are ours
    is :class:`Fences`.
    """

    def __init__(self, config: ShardingConfig | None = None, *, backoff: Backoff = DEFAULT_BACKOFF) -> None:
        self.config: ShardingConfig = config or ShardingConfig()
        self.backoff = backoff
        self.failures: int = 0
        """Consecutive rounds that failed unexpectedly (0 after a good round)."""
        self.renew_failures: int = 0
        """Consecutive peer renewals that failed unexpectedly (API errors are expected and not counted)."""
        self._wake = asyncio.Event()
        self._renewed = asyncio.Event()
        self._hub = HubWrites(self.config)
        self._members = Membership(self.config, self._hub, self._after_renewal)
        self._map = ShardMap(self.config)
        self._fences = Fences(
            self.config,
            self._hub,
            self._members,
            self._map,
            wake=self._wake.set,
            renewed=self._renewed.set,
            spawn=lambda coroutine, name: self._tasks.spawn(coroutine, name),
        )
        self._shares: Shares[int] = Shares(self.config.identity)
        self._said = GroupLog(self.config, self._members, self._fences, self._map)
        self._disagreed: dict[str, str] = {}  # peers last logged for announcing another shard count
        # The round's own tasks (closing, handing over, the watchdog and the pulse): owned, so
        # one that fails is logged with its traceback when it fails, and a loop is restarted.
        self._tasks = TaskSet(f"sharding {self.config.name}")
        # Clusters that left the fleet while their shard stayed ours, their work closing:
        # not reopened until the close is done, should they come back meanwhile.
        self._departing: dict[str, asyncio.Task[None]] = {}
        # How the heartbeat's thread reaches the hub; None: a connection of its own from
        # the hub's kubeconfig. Tests put a breakable client here.
        self._liveness: Connect | None = None
        self._seat: Seat | None = None

    @property
    def metrics(self) -> ShardMetrics | None:
        """This replica's sharding metrics, once :meth:`run` has registered them."""
        return self._hub.metrics

    @property
    def identity(self) -> str:
        return self.config.identity

    @property
    def owned(self) -> frozenset[str]:
        """Engaged clusters whose shard's fence this replica holds.

        Work in a cluster opens when the round that took its fence ends (during a
        long round, at least once per retry period), so for that moment a cluster
        can be owned before its work has opened.
        """
        return frozenset(self._fences.owned_clusters())

    def failing(self) -> list[str]:
        """The round's own loops (the watchdog, the pulse) that died and wait to restart."""
        return [
            f"sharding {self.config.name}: {loop.name} died ({loop.last_error}); restarting"
            for loop in self._tasks.failing()
        ]

    def problem(self) -> str | None:
        """Why this replica does no work now, or ``None`` while its peer Lease is renewed; for ``/readyz``.

        Without a renewed peer Lease the replica owns nothing (the watchdog has
        stopped its work), so it is not ready, and the line says what the hub
        answered: a refusal, no answer, a namespace that does not exist.
        """
        members = self._members
        if members.alive(time.monotonic()):
            return None
        refusal = members.refusal()
        trouble = members.trouble
        return f"{refusal}: {trouble}" if refusal and trouble else refusal

    def peers(self) -> dict[str, float]:
        """Live peers (identity → weight) as this replica sees them, itself included."""
        return self._members.live_peers(time.monotonic())

    def __repr__(self) -> str:
        return f"<ShardedCoordinator {self.identity!r} shards={len(self._fences.held)}>"

    # --- the loop -------------------------------------------------------------------------

    async def run(self, seat: Seat) -> None:
        """Campaign for this replica's share until cancelled; then release everything.

        Never returns or raises before it is cancelled: a round that fails is
        logged and retried with the backoff, and the watchdog stops all work
        if the peer Lease goes unrenewed meanwhile.
        """
        hub = seat.local
        if hub is None:
            raise ValueError("sharding needs a local cluster (the hub) to hold its Leases")
        self._seat = seat
        self._fences.seat = seat
        tasks = self._tasks = TaskSet(f"sharding {self.config.name}")  # afresh if run again
        seat.work.guard(self._members.refusal)
        self._hub.client = hub.client
        metrics = self._hub.metrics = ShardMetrics(seat.registry)
        # The watchdog and the pulse: a death counts with the failed rounds.
        tasks.crash_listeners.append(lambda _loop, _error: metrics.loop_failures.inc())
        informer = hub.cache.informer(
            LEASE, namespace=self.config.namespace, label_selector={GROUP_LABEL: self.config.name}
        )
        registration = informer.add_handler(
            ResourceEventHandler(
                lambda obj, _initial: self._observe(obj), lambda _old, new: self._observe(new), self._forget
            )
        )
        seat.engage_listeners.append(self._cluster_changed)
        seat.disengage_listeners.append(self._cluster_changed)
        watchdog = tasks.supervise(self._watchdog, "watchdog", backoff=self.backoff)
        self._members.main_loop = asyncio.get_running_loop()
        heartbeat = Heartbeat(
            f"sharding {self.config.name}",
            self._liveness or functools.partial(own_connection, hub.config, self._hub.request_timeout),
            self._beat,
            stall_limit=self.config.lease_duration,
            idle=self.config.retry_period,
        )
        pulse: asyncio.Task[None] | None = None
        try:
            while not await informer.wait_for_sync(self.config.lease_duration):
                log.warning("sharding %s: the Lease cache on the hub has not synced yet", self.config.name)
            # Liveness has a thread of its own (see heartbeat.py): neither a long round nor
            # a busy event loop delays a renewal. Announce first and let replicas that start
            # together see each other before anyone acquires fences.
            heartbeat.start()
            pulse = tasks.supervise(lambda: self._pulse(heartbeat), "pulse", backoff=self.backoff)
            await asyncio.sleep(self.config.retry_period)
            while True:
                try:
                    await self._round()
                    self.failures = 0
                except Exception as error:  # the campaign must outlive any failure
                    self.failures += 1
                    await self._failed("round", error, self.failures)
                    continue
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self.config.retry_period):
                        await self._wake.wait()
        finally:
            watchdog.cancel()
            if pulse is not None:
                pulse.cancel()
            await asyncio.shield(heartbeat.stop(self._hub.request_timeout))
            registration.remove()
            with contextlib.suppress(ValueError):
                seat.engage_listeners.remove(self._cluster_changed)
            with contextlib.suppress(ValueError):
                seat.disengage_listeners.remove(self._cluster_changed)
            try:
                await asyncio.shield(self._leave_group())
            finally:
                seat.work.guard(None)
                await asyncio.shield(tasks.close())  # what is left: cuts still cancelling

    async def _failed(self, what: str, error: Exception, failures: int) -> None:
        """Log and count the ``failures``-th unexpected failure of ``what``, then wait out the backoff."""
        assert self.metrics is not None
        self.metrics.loop_failures.inc()
        log.warning(
            "sharding %s: %s failed (%d in a row), retrying: %s",
            self.config.name,
            what,
            failures,
            f"{type(error).__name__}: {error}",
            exc_info=not isinstance(error, API_ERRORS),
        )
        await self.backoff.sleep(failures)

    async def _beat(self, client: Client) -> float:
        """One renewal of the peer Lease, on the heartbeat's thread; the next is due this much later."""
        try:
            await self._members.renew(client)
        except Exception as error:  # a garbled answer: log, back off, go on
            self.renew_failures += 1
            await self._failed("peer renewal", error, self.renew_failures)
            return 0.0  # the backoff was the wait
        self.renew_failures = 0
        return self.config.retry_period

    async def _pulse(self, heartbeat: Heartbeat) -> None:
        """Tick the heartbeat from this loop, measure how late the loop runs, restart a dead heartbeat.

        The heartbeat renews only while these ticks arrive (see heartbeat.py),
        so a replica whose loop stops turning loses its clusters.
        """
        assert self.metrics is not None
        loop = asyncio.get_running_loop()
        interval = self.config.retry_period / 2
        while True:
            due = loop.time() + interval
            await asyncio.sleep(interval)
            heartbeat.tick()
            lag = max(0.0, loop.time() - due)
            self.metrics.loop_lag.set(lag)
            if lag > self.config.renew_deadline / 2:
                log.warning(
                    "sharding %s: the event loop ran %.1fs late (liveness stops at %gs)",
                    self.config.name,
                    lag,
                    self.config.lease_duration,
                )
            if not heartbeat.running:
                log.error("sharding %s: the heartbeat thread had stopped; restarting it", self.config.name)
                try:
                    heartbeat.start()
                except RuntimeError as error:  # no thread to be had now: the next tick tries again
                    log.error("sharding %s: could not restart the heartbeat: %s", self.config.name, error)

    def _cluster_changed(self, _name: str, _cluster: Cluster) -> None:
        self._wake.set()

    # --- what the informer tells us -------------------------------------------------------

    def _observe(self, lease: JSON) -> None:
        meta = lease.get("metadata")
        if not isinstance(meta, dict):
            return
        labels = meta.get("labels") or {}
        annotations = meta.get("annotations") or {}
        name = str(meta.get("name", ""))
        holder = holder_of(lease)
        role = str(labels.get(ROLE_LABEL, ""))
        if role == "peer" and holder:
            weight = annotations.get(WEIGHT_ANNOTATION, "1")
            shards = str(annotations.get(SHARDS_ANNOTATION, ""))
            claims = annotations.get(SILENT_ANNOTATION, "")
            came = self._members.observe(name, holder, renew_time_of(lease), weight, lease, shards, claims)
            if came and holder != self.identity:
                self._wake.set()  # a peer came
        elif role == "fence":
            shard = str(annotations.get(SHARD_ANNOTATION, ""))
            shards = str(annotations.get(SHARDS_ANNOTATION, ""))
            self._fences.observe(name, shard, shards, holder, renew_time_of(lease), lease)

    def _forget(self, lease: JSON) -> None:
        meta = lease.get("metadata")
        name = str(meta.get("name", "")) if isinstance(meta, dict) else ""
        if self._members.forget(name):
            self._wake.set()
        self._fences.forget(name)

    async def _watchdog(self) -> None:
        """Stop all work once the peer Lease has gone unrenewed for ``renew_deadline``.

        The work gate already refuses new reconciles and their writes from
        that moment (see :meth:`Membership.refusal`); this closes the work. A
        renewal that came only after the deadline (a lapse) may not bridge it,
        however late this task runs: everything is dropped all the same, and
        the round takes back what is still ours through fresh fence writes.
        """
        members = self._members
        while True:
            lapses = members.lapses
            if lapses != members.lapses_handled:
                self._cut_all(
                    f"this replica's peer Lease went unrenewed for more than {self.config.renew_deadline:g}s "
                    "(renewed late: its shards may have moved meanwhile)"
                )
                members.lapses_handled = lapses
                self._wake.set()  # alive again: the round retakes what is still ours
                continue
            renewed = members.renewed_at
            if renewed is None or not self._fences.held:
                self._renewed.clear()
                await self._renewed.wait()
                continue
            remaining = renewed + self.config.renew_deadline - time.monotonic()
            if remaining > 0:
                self._renewed.clear()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(remaining):
                        await self._renewed.wait()
                continue
            deadline = self.config.renew_deadline
            self._cut_all(f"this replica could not renew its peer Lease within {deadline:g}s")
            self._renewed.clear()
            await self._renewed.wait()

    def _cut_all(self, reason: str) -> None:
        """Lose every held shard now; handovers in their grace lose the grace."""
        assert self._seat is not None
        held = list(self._fences.held)
        working = self._fences.working_in(held)
        for shard in held:
            if shard not in self._fences.leaving:
                self._fences.lose(shard, reason, working.get(shard, set()))
            else:
                # A handover in its grace period: no more grace, and no more writes; cancel its
                # reconciles now. (Not awaited here: a reconcile that ignores cancellation must
                # not stall the watchdog.)
                clusters = working.get(shard, set())
                self._seat.work.cut(clusters, f"shard group {self.config.name!r}: {reason}")
                for cluster in clusters:
                    self._tasks.spawn(self._seat.work.close(cluster), f"cut {cluster!r}")

    # --- one round ------------------------------------------------------------------------

    async def _round(self) -> None:
        assert self._seat is not None and self.metrics is not None
        fences = self._fences
        self._members.confirmed = {}
        now = time.monotonic()
        peers = self._members.live_peers(now)
        self.metrics.peers.set(len(peers))
        self._members.claims = self._members.silent_peers(now)  # named on our Lease by the next renewal
        if not self._members.alive(now):
            # Our peer Lease may have expired elsewhere: the watchdog has stopped (or is
            # stopping) our work, and nothing is written until a renewal succeeds.
            fences.count_owned()
            return
        # Every step below is a set operation or touches only what changed: a round runs
        # after every fence that changes hands.
        engaged = self._seat.clusters()
        self._map.update(engaged)
        self._said.peers(peers, now)
        disagree = self._disagree(now)
        desired = set() if disagree else self._shares.mine(self._map.in_use, peers)
        was, now_mine = self._map.clusters_of(fences.desired), self._map.clusters_of(desired)
        self.metrics.ownership_changes.labels("gained").inc(len(now_mine - was))
        self.metrics.ownership_changes.labels("lost").inc(len(was - now_mine))
        fences.desired = desired
        for shard in fences.held.keys() - desired - fences.leaving.keys():
            fences.leaving[shard] = self._tasks.spawn(fences.hand_over(shard), f"hand over shard {shard}")
        self._close_departed(engaged)
        if self._members.alive(now):
            # Fences that still name us on the hub though we dropped them (the watchdog
            # stopped our work, or this identity restarted): nobody else may take them
            # while we live, so give back those we do not want.
            for shard in fences.naming_us - fences.held.keys() - fences.leaving.keys() - desired:
                fences.leaving[shard] = self._tasks.spawn(
                    fences.give_back(shard, fences.seen[shard].lease), f"give back shard {shard}"
                )
        settled = (desired & fences.held.keys()) - fences.leaving.keys()
        reopen = [name for name in self._map.clusters_of(settled) if not self._seat.work.admits(name)]
        wanted = sorted(desired - fences.held.keys() - fences.leaving.keys())
        if self._members.alive(now):
            await self._acquire_all(wanted, reopen, now)
            self._said.waiting(wanted, peers, now)
            if not disagree:
                self._said.free_fences(peers, time.monotonic())
        fences.count_owned()
        if self._members.alive(time.monotonic()):
            await self._members.collect_dead(peers, time.monotonic())
        if self._members.alive(time.monotonic()):
            await fences.collect_orphans(peers, time.monotonic())
        self._members.prune_gone(time.monotonic())

    def _disagree(self, now: float) -> bool:
        """Whether a live peer announces another shard count (logged once); then we hold nothing."""
        disagreeing = self._members.disagreeing(now)
        if disagreeing and disagreeing != self._disagreed:
            log.error(
                "sharding %s: %s; this replica counts %d shards, so it takes no fence and hands over what "
                "it holds until every live peer agrees (set ShardingConfig.shards alike on every replica, "
                "and do not run replicas of a release without shard fences beside this one)",
                self.config.name,
                "; ".join(
                    f"peer {peer!r} announces {shards + ' shards' if shards else 'no shard count'}"
                    for peer, shards in sorted(disagreeing.items())
                ),
                self.config.shards,
            )
        elif self._disagreed and not disagreeing:
            log.info(
                "sharding %s: every live peer now counts %d shards", self.config.name, self.config.shards
            )
        self._disagreed = disagreeing
        return bool(disagreeing)

    def _close_departed(self, engaged: dict[str, Cluster]) -> None:
        """Close work in clusters that left the fleet while their shard stays ours (with grace)."""
        assert self._seat is not None
        for cluster in self._seat.work.opened - engaged.keys():
            if self._map.shard(cluster) in self._fences.leaving or cluster in self._departing:
                continue  # its shard's handover closes it, or it is closing already
            closing = self._seat.work.close(cluster, grace=self.config.handover_grace)
            close = self._tasks.spawn(closing, f"close departed {cluster!r}")
            self._departing[cluster] = close

            def closed(_task: asyncio.Task[None], cluster: str = cluster) -> None:
                self._departing.pop(cluster, None)
                self._wake.set()  # back in the fleet meanwhile? The next round reopens it.

            close.add_done_callback(closed)

    async def _acquire_all(self, wanted: list[int], reopen: list[str], now: float) -> None:
        """Take the fences of shards ``wanted``, ``CONCURRENT_WRITES`` at a time, and open what is won.

        A cold start or a failover asks for many fences at once. They go out as
        a sliding window (a slow answer holds up one place, not a batch), and
        the clusters of what has been won open at least once per retry period
        while the rest is still being taken, in one replay for all of it (plus
        ``reopen``, clusters of shards already held): a mapping handler's replay
        reads every cluster's cache, so not one per cluster. No acquisition
        outlives the round. A fence whose write fails in a way ``acquire`` does
        not expect (an answer that is no Lease) costs only itself: the others
        are still taken and opened, then the round fails and is retried with the
        loop's backoff.
        """
        won: list[str] = [*reopen]
        opened_at = time.monotonic()
        turns = asyncio.Semaphore(CONCURRENT_WRITES)
        failed: list[Exception] = []

        async def take(shard: int) -> None:
            nonlocal won, opened_at
            async with turns:
                try:
                    if await self._fences.acquire(shard, now):
                        won.extend(self._map.members(shard))
                except Exception as error:  # one fence's failure is its own: the others go on
                    failed.append(error)
            if time.monotonic() - opened_at >= self.config.retry_period:
                self._open(won)
                won, opened_at = [], time.monotonic()

        tasks = [asyncio.ensure_future(take(shard)) for shard in wanted]
        try:
            await asyncio.gather(*tasks)
        finally:
            for task in tasks:
                task.cancel()  # after a cancellation: the round's writes end with it
        self._open(won)
        if failed:
            # The fences won are held and their work is open; the round still failed, and
            # is retried with the loop's backoff, worded by the first failure.
            raise failed[0]

    def _open(self, clusters: list[str]) -> None:
        """Open work in ``clusters`` whose shard is still ours, and only while we are alive.

        The watchdog may have dropped everything while the acquisitions ran.
        """
        assert self._seat is not None
        fences = self._fences
        opening = []
        for name in clusters:
            shard = self._map.shard(name)
            if (
                shard in fences.held
                and shard not in fences.leaving
                and name in self._map
                and name not in self._departing
            ):
                opening.append(name)
        if opening and self._members.alive(time.monotonic()):
            self._seat.work.open(*opening)

    def _after_renewal(self) -> None:
        """On the main loop: wake the watchdog and run a round right after each renewal."""
        self._renewed.set()
        self._wake.set()

    async def _leave_group(self) -> None:
        """Graceful stop: stop all work, release every fence, withdraw the peer Lease."""
        if self._seat is None or self._hub.client is None:
            return
        seat = self._seat
        for task in [*self._fences.leaving.values(), *self._departing.values()]:
            task.cancel()
        await asyncio.gather(
            *self._fences.leaving.values(), *self._departing.values(), return_exceptions=True
        )
        # With the fences that still name us though we dropped them: give them back too.
        held = [*self._fences.held.items(), *self._fences.still_ours()]
        clusters = set().union(*self._fences.working_in(shard for shard, _ in held).values())
        self._fences.held.clear()
        await asyncio.gather(*(seat.work.close(cluster) for cluster in clusters), return_exceptions=True)
        results = await asyncio.gather(
            *(self._fences.release(shard, fence) for shard, fence in held), return_exceptions=True
        )
        released_count = sum(1 for result in results if result is True)
        if self.metrics is not None:
            self.metrics.fence_releases.inc(released_count)
            self.metrics.owned.set(0)
        await self._members.withdraw()
        log.info(
            "sharding %s: %s left the group (%d fences released)",
            self.config.name,
            self.identity,
            released_count,
        )
