"""Sharding the fleet across replicas with Leases on the hub, at a write rate set by the replicas.

Liveness is per replica, fencing is per cluster, and only liveness is renewed.

- **Peer Leases.** Each replica holds one Lease (``<group>-peer-<hash>``) and
  renews it every ``retry_period``, from a thread of its own so that a busy
  event loop cannot delay it (see heartbeat.py): the group's only steady-state writes, so
  the hub sees ``replicas / retry_period`` writes per second however many
  clusters there are. A peer whose Lease this replica has watched unchanged
  for ``lease_duration`` (on its own monotonic clock: clocks are never
  compared) has dropped out.
- **Ownership.** Every replica computes the same owner for every cluster by
  weighted rendezvous hashing over the live peers, so when a peer goes only its
  clusters move, and a new peer takes about ``1/n`` from everyone.
- **Fences.** A replica works on a cluster only while it holds the cluster's
  fence Lease (``<group>-fence-<hash>``), which names its holder and is
  written only when it changes hands: acquired (optimistic concurrency on
  ``resourceVersion``, so of two contenders exactly one wins) and released or
  deleted. A fence stays valid, unrenewed, for as long as its holder's peer
  Lease is live. It may be taken when it is free (released), or when its
  holder has shown no sign of life (peer Lease renewal, or deletion) for a full
  ``lease_duration`` as observed here, confirmed by a fresh read of the
  holder's peer Lease just before the write.
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
release, takes it. Each cluster's fence, and therefore its work, keeps its own
lifetime: losing one cluster never waits on another.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import logging
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from prometheus_client import Counter, Gauge

from .._base.backoff import DEFAULT_BACKOFF, Backoff
from .._base.errors import AlreadyExists, APIError, Conflict, NotFound, Unreachable
from .._base.objects import JSON
from .._cache.informer import ResourceEventHandler
from .heartbeat import Connect, Heartbeat, own_connection
from .lease import (
    LEASE,
    Observed,
    default_identity,
    holder_of,
    lease_object,
    released,
    renew_time_of,
    take,
)
from .rendezvous import owner

if TYPE_CHECKING:
    from .._client.client import Client
    from .._fleet.cluster import Cluster
    from .coordinator import Seat

log = logging.getLogger("mcruntime.sharding")

GROUP_LABEL = "mcruntime.dev/shard-group"
ROLE_LABEL = "mcruntime.dev/shard-role"
CLUSTER_ANNOTATION = "mcruntime.dev/cluster"
WEIGHT_ANNOTATION = "mcruntime.dev/weight"
WRITE_PURPOSES = (
    "peer-renew",
    "peer-leave",
    "peer-gc",
    "fence-acquire",
    "fence-release",
    "fence-delete",
    "fence-gc",
)
_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]{0,38}[a-z0-9])?$")
_API_ERRORS = (APIError, Unreachable, OSError, TimeoutError)
_CONCURRENT_WRITES = 16
_ANSWERS_A_LEASE = frozenset({"peer-renew", "fence-acquire", "fence-release"})


@dataclass(frozen=True)
class ShardingConfig:
    """Where the Leases live, who this replica is, and how fast work moves.

    ``name`` names the group: every replica of one controller uses the same
    name and namespace. ``weight`` is this replica's relative share.
    ``handover_grace`` is how long in-flight reconciles of a cluster that moves
    to another replica may run before they are cancelled. ``peer_gc_after`` is
    how long a peer must have been silent before a survivor deletes its peer
    Lease (crashed replicas would otherwise leave one behind each), and how
    long a fence must have been quiet, its cluster gone and its holder dead,
    before a survivor deletes it.
    """

    name: str = "mcruntime"
    namespace: str = "default"
    identity: str = field(default_factory=default_identity)
    weight: float = 1.0
    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0
    handover_grace: float = 5.0
    peer_gc_after: float = 300.0

    def __post_init__(self) -> None:
        if not _NAME.match(self.name):
            raise ValueError(
                f"sharding group name {self.name!r} must be a lowercase DNS label of at most 40 characters"
            )
        if not self.weight > 0:
            raise ValueError(f"sharding weight must be positive, not {self.weight}")
        if not self.identity:
            raise ValueError("sharding identity must not be empty")
        if not self.lease_duration > self.renew_deadline > self.retry_period > 0:
            raise ValueError(
                "sharding needs lease_duration > renew_deadline > retry_period > 0, got "
                f"{self.lease_duration} > {self.renew_deadline} > {self.retry_period}"
            )
        if self.handover_grace < 0:
            raise ValueError(f"handover_grace must not be negative, not {self.handover_grace}")
        if not self.peer_gc_after > self.lease_duration:
            raise ValueError(
                f"peer_gc_after ({self.peer_gc_after}) must be longer than "
                f"lease_duration ({self.lease_duration})"
            )

    def peer_lease(self, identity: str) -> str:
        return f"{self.name}-peer-{_digest(identity)}"

    def fence_lease(self, cluster: str) -> str:
        return f"{self.name}-fence-{_digest(cluster)}"


def _digest(text: str) -> str:
    return hashlib.blake2b(text.encode(), digest_size=8).hexdigest()


@dataclass
class _Peer:
    """A peer Lease as last seen, and when its renewal last changed here."""

    observed: Observed
    lease: JSON
    weight: float = 1.0


@dataclass
class _FenceSeen:
    """A fence Lease as last seen: its holder, since when (here), and the object (for writes)."""

    observed: Observed
    lease: JSON


class ShardMetrics:
    """What an operator watches: ownership, its changes, and what this replica writes on the hub."""

    def __init__(self, registry: Any) -> None:
        self.owned: Gauge = Gauge(
            "mcruntime_shard_clusters_owned",
            "Clusters whose fence this replica holds",
            registry=registry,
        )
        self.peers: Gauge = Gauge("mcruntime_shard_peers", "Live peers in the shard group", registry=registry)
        self.ownership_changes: Counter = Counter(
            "mcruntime_shard_ownership_changes_total",
            "Clusters that became or stopped being this replica's by rendezvous hashing",
            ["direction"],
            registry=registry,
        )
        self.fence_acquisitions: Counter = Counter(
            "mcruntime_shard_fence_acquisitions_total", "Fences this replica acquired", registry=registry
        )
        self.fence_releases: Counter = Counter(
            "mcruntime_shard_fence_releases_total",
            "Fences this replica released on handover or shutdown",
            registry=registry,
        )
        self.fence_losses: Counter = Counter(
            "mcruntime_shard_fence_losses_total",
            "Fences lost: taken over, deleted, or dropped when this replica missed its renew deadline",
            registry=registry,
        )
        self.hub_writes: Counter = Counter(
            "mcruntime_shard_hub_writes_total",
            "Lease writes (create, update, delete) this replica sent to the hub, by purpose",
            ["purpose"],
            registry=registry,
        )
        self.loop_lag: Gauge = Gauge(
            "mcruntime_shard_event_loop_lag_seconds",
            "How late the event loop last ran the sharding's pulse; liveness stops past lease_duration",
            registry=registry,
        )
        self.loop_failures: Counter = Counter(
            "mcruntime_shard_loop_failures_total",
            "Coordination rounds that failed unexpectedly (logged and retried with backoff)",
            registry=registry,
        )
        for purpose in WRITE_PURPOSES:
            self.hub_writes.labels(purpose)


class ShardedCoordinator:
    """Splits the engaged clusters between replicas; pass it as ``Manager(coordinator=...)``.

    Every replica keeps its providers and caches running for every cluster
    (warm standby): ownership changes only open and close work. ``backoff``
    paces retries after a round fails unexpectedly (a Lease kind the hub does
    not serve, a garbled answer); the loop never gives up.
    """

    def __init__(self, config: ShardingConfig | None = None, *, backoff: Backoff = DEFAULT_BACKOFF) -> None:
        self.config: ShardingConfig = config or ShardingConfig()
        self.backoff = backoff
        self.failures: int = 0
        """Consecutive rounds that failed unexpectedly (0 after a good round)."""
        self.renew_failures: int = 0
        """Consecutive peer renewals that failed unexpectedly (API errors are expected and not counted)."""
        self._peers: dict[str, _Peer] = {}
        self._peer_names: dict[str, str] = {}  # peer Lease name → identity
        self._gone: dict[str, float] = {}  # identity → when its peer Lease was seen deleted
        self._fence_seen: dict[str, _FenceSeen] = {}  # cluster → its fence as seen
        self._fence_names: dict[str, str] = {}  # fence Lease name → cluster
        self._fences: dict[str, JSON] = {}  # clusters whose fence we hold → the object we wrote
        self._leaving: dict[str, asyncio.Task[None]] = {}
        self._cuts: set[asyncio.Task[None]] = set()
        self._confirmed: dict[str, asyncio.Future[bool]] = {}  # per round: holder → confirmed silent
        self._peer_lease: JSON | None = None
        self._peer_renewed_at: float | None = None  # written by the heartbeat's thread
        self._main_loop: asyncio.AbstractEventLoop | None = None
        # How the heartbeat's thread reaches the hub; None: a connection of its own from
        # the hub's kubeconfig. Tests put a breakable client here.
        self._liveness: Connect | None = None
        self._desired: set[str] = set()
        self._wake = asyncio.Event()
        self._renewed = asyncio.Event()
        self._seat: Seat | None = None
        self._client: Client | None = None
        # A request may take longer than a retry period on a busy hub; half the renew
        # deadline still leaves a second attempt before the watchdog stops the work.
        self._request_timeout = max(self.config.retry_period, self.config.renew_deadline / 2)
        self.metrics: ShardMetrics | None = None

    @property
    def identity(self) -> str:
        return self.config.identity

    @property
    def owned(self) -> frozenset[str]:
        """Clusters whose fence this replica holds, i.e. that it works on now."""
        return frozenset(self._fences)

    def peers(self) -> dict[str, float]:
        """Live peers (identity → weight) as this replica sees them, itself included."""
        return self._live_peers(time.monotonic())

    def __repr__(self) -> str:
        return f"<ShardedCoordinator {self.identity!r} owns={len(self._fences)}>"

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
        self._client = hub.client
        self.metrics = ShardMetrics(seat.registry)
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
        watchdog = asyncio.create_task(self._watchdog(), name=f"sharding {self.config.name} watchdog")
        self._main_loop = asyncio.get_running_loop()
        heartbeat = Heartbeat(
            f"sharding {self.config.name}",
            self._liveness or functools.partial(own_connection, hub.config, self._request_timeout),
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
            pulse = asyncio.create_task(self._pulse(heartbeat), name=f"sharding {self.config.name} pulse")
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
            await asyncio.shield(heartbeat.stop(self._request_timeout))
            registration.remove()
            with contextlib.suppress(ValueError):
                seat.engage_listeners.remove(self._cluster_changed)
            with contextlib.suppress(ValueError):
                seat.disengage_listeners.remove(self._cluster_changed)
            await asyncio.shield(self._leave_group())

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
            exc_info=not isinstance(error, _API_ERRORS),
        )
        await self.backoff.sleep(failures)

    async def _beat(self, client: Client) -> float:
        """One renewal of the peer Lease, on the heartbeat's thread; the next is due this much later."""
        try:
            await self._renew_peer(client)
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

    async def _write(self, purpose: str, request: Callable[[], Awaitable[JSON | None]]) -> JSON | None:
        """One Lease write, counted by purpose; a garbled answer raises ``ValueError``."""
        assert self.metrics is not None
        self.metrics.hub_writes.labels(purpose).inc()
        answer = await request()
        if purpose in _ANSWERS_A_LEASE and not (
            isinstance(answer, dict) and isinstance(answer.get("metadata"), dict)
        ):
            raise ValueError(
                f"the hub answered a Lease write ({purpose}) with no Lease: {str(answer)[:120]!r}"
            )
        return answer

    def _why(self, error: BaseException) -> str:
        """An error worded for the log; a timeout's message is empty, so say what it was."""
        if isinstance(error, TimeoutError) and not str(error):
            return f"no answer within {self._request_timeout:g}s"
        return str(error) or type(error).__name__

    # --- what the informer tells us -------------------------------------------------------

    def _observe(self, lease: JSON) -> None:
        meta = lease.get("metadata")
        if not isinstance(meta, dict):
            return
        labels = meta.get("labels") or {}
        annotations = meta.get("annotations") or {}
        name = str(meta.get("name", ""))
        holder = holder_of(lease)
        renew_time = renew_time_of(lease)
        now = time.monotonic()
        role = str(labels.get(ROLE_LABEL, ""))
        if role == "peer" and holder:
            try:
                weight = float(annotations.get(WEIGHT_ANNOTATION, "1"))
            except ValueError:
                weight = 1.0
            peer = self._peers.get(holder)
            self._peer_names[name] = holder
            self._gone.pop(holder, None)
            if peer is None:
                weight = weight if weight > 0 else 1.0
                self._peers[holder] = _Peer(Observed(holder, renew_time, now), lease, weight)
                if holder != self.identity:
                    self._wake.set()  # a peer came
            else:
                peer.observed.see(holder, renew_time, now)
                peer.lease = lease
        elif role == "fence":
            cluster = str(annotations.get(CLUSTER_ANNOTATION, ""))
            if name != self.config.fence_lease(cluster):
                return  # its annotation names another cluster than its name: not a fence of ours
            self._fence_names[name] = cluster
            seen = self._fence_seen.get(cluster)
            if seen is None:
                self._fence_seen[cluster] = _FenceSeen(Observed(holder, renew_time, now), lease)
                changed_holder = True
            else:
                changed_holder = seen.observed.holder != holder
                seen.observed.see(holder, renew_time, now)
                seen.lease = lease
            if changed_holder and holder != self.identity:
                if cluster in self._fences and cluster not in self._leaving:
                    self._lose(cluster, f"its fence is now held by {holder or 'nobody'}")
                self._wake.set()  # released or taken: the owner-to-be may act

    def _forget(self, lease: JSON) -> None:
        meta = lease.get("metadata")
        name = str(meta.get("name", "")) if isinstance(meta, dict) else ""
        identity = self._peer_names.pop(name, None)
        if identity is not None:
            self._peers.pop(identity, None)
            self._gone[identity] = time.monotonic()
            self._wake.set()
        cluster = self._fence_names.pop(name, None)
        if cluster is not None:
            self._fence_seen.pop(cluster, None)
            if cluster in self._fences and cluster not in self._leaving:
                self._lose(cluster, "its fence Lease was deleted")
            self._wake.set()

    # --- liveness -------------------------------------------------------------------------

    def _alive(self, now: float) -> bool:
        renewed = self._peer_renewed_at
        return renewed is not None and now - renewed < self.config.renew_deadline

    def _live_peers(self, now: float) -> dict[str, float]:
        peers: dict[str, float] = {}
        for identity, peer in self._peers.items():
            if identity != self.identity and peer.observed.quiet_for(now) <= self.config.lease_duration:
                peers[identity] = peer.weight
        if self._alive(now):
            peers[self.identity] = self.config.weight
        return peers

    def _last_sign_of_life(self, holder: str, fence: _FenceSeen | None) -> float:
        """The latest moment this replica knows ``holder`` may have been working."""
        signs = [self._gone.get(holder, float("-inf"))]
        peer = self._peers.get(holder)
        if peer is not None:
            signs.append(peer.observed.since)
        if fence is not None:
            signs.append(fence.observed.since)
        return max(signs)

    async def _holder_silent(self, holder: str, fence: _FenceSeen | None, now: float) -> bool:
        """Whether ``holder`` has been silent for a full term, confirmed by a fresh read of its peer Lease.

        The informer may lag; the read makes sure a renewal we have not
        watched yet is not mistaken for silence. One read per holder per round.
        """
        if now - self._last_sign_of_life(holder, fence) <= self.config.lease_duration:
            return False
        if holder not in self._confirmed:
            # Every cluster of a dead holder asks at once: one read answers them all.
            self._confirmed[holder] = asyncio.ensure_future(self._confirm_silent(holder, now))
        return await asyncio.shield(self._confirmed[holder])

    async def _confirm_silent(self, holder: str, now: float) -> bool:
        assert self._client is not None
        silent = False
        try:
            async with asyncio.timeout(self._request_timeout):
                current = await self._client.get(
                    LEASE, self.config.peer_lease(holder), namespace=self.config.namespace
                )
        except _API_ERRORS as error:
            if not isinstance(error, NotFound):
                log.warning(
                    "sharding %s: could not read the peer Lease of %r: %s",
                    self.config.name,
                    holder,
                    self._why(error),
                )
                return False
            if holder in self._gone:
                silent = True  # its deletion was watched a full term ago
            else:
                self._gone[holder] = time.monotonic()  # deleted unseen: count the term from now
        else:
            peer = self._peers.get(holder)
            if peer is None:
                self._peers[holder] = _Peer(Observed(holder, renew_time_of(current), now), current)
            else:
                silent = not peer.observed.see(holder_of(current) or holder, renew_time_of(current))
        return silent

    async def _watchdog(self) -> None:
        """Stop all work the moment the peer Lease has gone unrenewed for ``renew_deadline``."""
        while True:
            renewed = self._peer_renewed_at
            if renewed is None or not self._fences:
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
            assert self._seat is not None
            for cluster in list(self._fences):
                if cluster not in self._leaving:
                    self._lose(
                        cluster,
                        f"this replica could not renew its peer Lease within {self.config.renew_deadline:g}s",
                    )
                else:
                    # A handover in its grace period: no more grace, cancel its reconciles now.
                    # (Not awaited here: a reconcile that ignores cancellation must not stall the watchdog.)
                    cut = asyncio.create_task(self._seat.work.close(cluster))
                    self._cuts.add(cut)
                    cut.add_done_callback(self._cuts.discard)
            self._renewed.clear()
            await self._renewed.wait()

    # --- one round ------------------------------------------------------------------------

    async def _round(self) -> None:
        assert self._seat is not None and self.metrics is not None
        self._confirmed = {}
        now = time.monotonic()
        peers = self._live_peers(now)
        self.metrics.peers.set(len(peers))
        if not self._alive(now):
            # Our peer Lease may have expired elsewhere: the watchdog has stopped (or is
            # stopping) our work, and nothing is written until a renewal succeeds.
            self.metrics.owned.set(len(self._fences))
            return
        clusters = self._seat.clusters()
        desired = {name for name in clusters if owner(name, peers) == self.identity}
        self.metrics.ownership_changes.labels("gained").inc(len(desired - self._desired))
        self.metrics.ownership_changes.labels("lost").inc(len(self._desired - desired))
        self._desired = desired
        for name in list(self._fences):
            if name not in desired and name not in self._leaving:
                self._leaving[name] = asyncio.create_task(self._hand_over(name))
        if self._alive(now):
            # Fences that still name us on the hub though we dropped them (the watchdog
            # stopped our work, or this identity restarted): nobody else may take them
            # while we live, so give back those we do not want.
            for name, seen in list(self._fence_seen.items()):
                if (
                    seen.observed.holder == self.identity
                    and name not in self._fences
                    and name not in self._leaving
                    and name not in desired
                ):
                    self._leaving[name] = asyncio.create_task(self._give_back(name, seen.lease))
        reopen = [
            name
            for name in desired
            if name in self._fences and name not in self._leaving and not self._seat.work.admits(name)
        ]
        wanted = sorted(name for name in desired if name not in self._fences and name not in self._leaving)
        if self._alive(now):
            acquired: list[str] = []
            # In batches: a cold start or a failover asks for hundreds of fences at once.
            for start in range(0, len(wanted), _CONCURRENT_WRITES):
                batch = wanted[start : start + _CONCURRENT_WRITES]
                results = await asyncio.gather(*(self._acquire_fence(name, now) for name in batch))
                acquired.extend(name for name, won in zip(batch, results, strict=True) if won)
        else:
            acquired, reopen = [], []
        # Open only what is still ours and only while we are alive: the watchdog may have
        # dropped everything while the acquisitions ran.
        opening = [
            name for name in (*acquired, *reopen) if name in self._fences and name not in self._leaving
        ]
        if opening and self._alive(time.monotonic()):
            # One replay for everything won this round, not one per cluster.
            self._seat.work.open(*opening)
        self.metrics.owned.set(len(self._fences))
        if self._alive(time.monotonic()):
            await self._collect_dead_peers(peers, time.monotonic())
        if self._alive(time.monotonic()):
            await self._collect_orphan_fences(peers, time.monotonic())
        self._prune_gone(time.monotonic())

    # --- the peer Lease ---------------------------------------------------------------------

    async def _renew_peer(self, client: Client) -> None:
        """Renew (or create) the peer Lease; runs on the heartbeat's thread."""
        started = time.monotonic()
        try:
            async with asyncio.timeout(self._request_timeout):
                if self._peer_lease is None:
                    self._peer_lease = await self._create_or_take_peer(client)
                else:
                    lease = take(self._peer_lease, self.identity, self.config.lease_duration)
                    self._peer_lease = await self._write("peer-renew", lambda: client.update(lease))
        except (Conflict, NotFound):
            self._peer_lease = None  # someone touched it; read it again next round
            return
        except TimeoutError:
            log.warning(
                "sharding %s: could not renew this replica's peer Lease: no answer within %gs",
                self.config.name,
                self._request_timeout,
            )
            return
        except _API_ERRORS as error:
            log.warning("sharding %s: could not renew this replica's peer Lease: %s", self.config.name, error)
            return
        self._peer_renewed_at = started
        if self._main_loop is not None:
            with contextlib.suppress(RuntimeError):  # the main loop closed: nobody left to tell
                self._main_loop.call_soon_threadsafe(self._after_renewal)

    def _after_renewal(self) -> None:
        """On the main loop: wake the watchdog and run a round right after each renewal."""
        self._renewed.set()
        self._wake.set()

    async def _create_or_take_peer(self, client: Client) -> JSON | None:
        name = self.config.peer_lease(self.identity)
        fresh = lease_object(
            name,
            self.config.namespace,
            self.identity,
            self.config.lease_duration,
            labels={GROUP_LABEL: self.config.name, ROLE_LABEL: "peer"},
            annotations={WEIGHT_ANNOTATION: repr(self.config.weight)},
        )
        try:
            return await self._write("peer-renew", lambda: client.create(fresh))
        except AlreadyExists:
            current = await client.get(LEASE, name, namespace=self.config.namespace)
            current["metadata"]["annotations"] = fresh["metadata"]["annotations"]
            renewed = take(current, self.identity, self.config.lease_duration)
            return await self._write("peer-renew", lambda: client.update(renewed))

    async def _collect_dead_peers(self, live: dict[str, float], now: float) -> None:
        """Delete peer Leases silent for ``peer_gc_after``; one survivor does it, with a precondition.

        The delete names the resourceVersion this replica watched unchanged,
        so a peer that renewed meanwhile (it was alive after all) keeps its
        Lease: the delete fails with a Conflict.
        """
        for identity, peer in list(self._peers.items()):
            if identity == self.identity or peer.observed.quiet_for(now) <= self.config.peer_gc_after:
                continue
            if owner(f"peer-gc\x00{identity}", live) != self.identity:
                continue  # another survivor collects this one
            if not await self._delete_as_seen("peer-gc", peer.lease, "a dead peer's Lease"):
                continue
            log.info(
                "sharding %s: deleted the peer Lease of %r, silent for %.0fs",
                self.config.name,
                identity,
                peer.observed.quiet_for(now),
            )

    async def _collect_orphan_fences(self, live: dict[str, float], now: float) -> None:
        """Delete fences of clusters that left the fleet while no live replica held them.

        A live holder deletes a departed cluster's fence itself on handover; a
        fence is orphaned when its holder died first (or it was left released).
        One survivor deletes it once it has been quiet for ``peer_gc_after``,
        its cluster is not engaged here, and its holder is not a live peer; the
        delete names the resourceVersion watched, so a replica that took the
        fence meanwhile keeps it (Conflict). Deleting a fence whose cluster is
        merely not discovered here yet is harmless: its owner creates it again.
        """
        assert self._seat is not None
        clusters = self._seat.clusters()
        for cluster, seen in list(self._fence_seen.items()):
            holder = seen.observed.holder
            if (
                cluster in clusters
                or cluster in self._fences
                or cluster in self._leaving
                or (holder and (holder in live or holder == self.identity))
                or seen.observed.quiet_for(now) <= self.config.peer_gc_after
                or owner(f"fence-gc\x00{cluster}", live) != self.identity
            ):
                continue
            if not await self._delete_as_seen("fence-gc", seen.lease, "an orphaned fence"):
                continue
            log.info(
                "sharding %s: deleted the fence of %r (cluster gone, holder %s), quiet for %.0fs",
                self.config.name,
                cluster,
                holder or "none",
                seen.observed.quiet_for(now),
            )

    async def _delete_as_seen(self, purpose: str, lease: JSON, what: str) -> bool:
        """Delete ``lease`` only if it is still the version watched; whether this call deleted it.

        The resourceVersion precondition is what makes collecting safe: a
        Lease renewed or taken since it was seen survives (Conflict).
        """
        assert self._client is not None
        client = self._client
        meta = lease.get("metadata") or {}
        name = str(meta.get("name", ""))
        version = str(meta.get("resourceVersion", ""))
        if not name or not version:
            return False
        try:
            async with asyncio.timeout(self._request_timeout):
                await self._write(
                    purpose,
                    functools.partial(
                        client.delete, LEASE, name, namespace=self.config.namespace, resource_version=version
                    ),
                )
        except (NotFound, Conflict):
            return False
        except _API_ERRORS as error:
            log.warning("sharding %s: could not delete %s: %s", self.config.name, what, self._why(error))
            return False
        return True

    def _prune_gone(self, now: float) -> None:
        horizon = self.config.peer_gc_after + self.config.lease_duration
        for identity, moment in list(self._gone.items()):
            if now - moment > horizon:
                del self._gone[identity]

    # --- fences -----------------------------------------------------------------------------

    async def _acquire_fence(self, cluster: str, now: float) -> bool:
        """Take the fence of ``cluster`` if it is free; returns whether work may start there."""
        assert self._seat is not None and self.metrics is not None and self._client is not None
        client = self._client
        seen = self._fence_seen.get(cluster)
        if not self._alive(time.monotonic()):
            return False  # never take a fence while our own peer Lease may have expired
        try:
            async with asyncio.timeout(self._request_timeout):
                if seen is None:
                    fresh = lease_object(
                        self.config.fence_lease(cluster),
                        self.config.namespace,
                        self.identity,
                        self.config.lease_duration,
                        labels={GROUP_LABEL: self.config.name, ROLE_LABEL: "fence"},
                        annotations={CLUSTER_ANNOTATION: cluster},
                    )
                    written = await self._write("fence-acquire", lambda: client.create(fresh))
                else:
                    holder = seen.observed.holder
                    if holder not in ("", self.identity) and not await self._holder_silent(holder, seen, now):
                        return False
                    # The watched object's resourceVersion: if anything changed since, a Conflict.
                    taken = take(seen.lease, self.identity, self.config.lease_duration)
                    written = await self._write("fence-acquire", lambda: client.update(taken))
        except (AlreadyExists, Conflict, NotFound):
            return False  # another replica moved first; the informer will tell us who
        except _API_ERRORS as error:
            log.warning(
                "sharding %s: could not acquire the fence of %r: %s",
                self.config.name,
                cluster,
                self._why(error),
            )
            return False
        assert written is not None
        self._fences[cluster] = written
        self.metrics.fence_acquisitions.inc()
        self._renewed.set()  # the watchdog guards a non-empty set now
        if cluster not in self._seat.clusters() or cluster not in self._desired:
            # It left, or moved, while we were acquiring: give the fence straight back.
            self._leaving[cluster] = asyncio.create_task(self._hand_over(cluster))
            return False
        log.info("sharding %s: %s now works on cluster %r", self.config.name, self.identity, cluster)
        return True

    def _lose(self, cluster: str, reason: str) -> None:
        """Stop work on ``cluster`` without waiting here: the close runs as its own task."""
        assert self._seat is not None and self.metrics is not None
        if self._fences.pop(cluster, None) is None:
            return
        self.metrics.fence_losses.inc()
        self.metrics.owned.set(len(self._fences))
        log.warning(
            "sharding %s: %s stops work on cluster %r: %s", self.config.name, self.identity, cluster, reason
        )
        seat = self._seat

        async def close() -> None:
            try:
                await seat.work.close(cluster)
            finally:
                self._leaving.pop(cluster, None)
                self._wake.set()

        self._leaving[cluster] = asyncio.create_task(close())

    async def _hand_over(self, cluster: str) -> None:
        """Stop work in ``cluster`` (with a short grace), then release its fence for the new owner.

        The fence stays ours while our peer Lease is live, so the grace needs
        no budget against an expiry; the watchdog still cuts it short if this
        replica stops renewing.
        """
        assert self._seat is not None and self.metrics is not None
        try:
            if cluster not in self._fences:
                return
            await self._seat.work.close(cluster, grace=self.config.handover_grace)
            fence = self._fences.get(cluster)
            if fence is None:
                return  # lost meanwhile: nothing of ours to release
            # A cluster that left the fleet takes its fence along; one that moved keeps it for its new owner.
            gone = cluster not in self._seat.clusters()
            if await self._release(cluster, fence, delete=gone):
                self.metrics.fence_releases.inc()
                log.info("sharding %s: %s handed cluster %r over", self.config.name, self.identity, cluster)
                self._fences.pop(cluster, None)
            # Otherwise keep it: the next round tries again (its work stays closed meanwhile).
        finally:
            self._leaving.pop(cluster, None)
            self.metrics.owned.set(len(self._fences))
            self._wake.set()

    async def _give_back(self, cluster: str, fence: JSON) -> None:
        """Release a fence that names us but that we do not work on (our work there is closed)."""
        try:
            assert self._seat is not None and self.metrics is not None
            gone = cluster not in self._seat.clusters()
            if await self._release(cluster, fence, delete=gone):
                self.metrics.fence_releases.inc()
                log.info(
                    "sharding %s: %s gave back the fence of %r", self.config.name, self.identity, cluster
                )
        finally:
            self._leaving.pop(cluster, None)
            self._wake.set()

    async def _release(self, cluster: str, fence: JSON, *, delete: bool = False) -> bool:
        """Free (or delete) a fence we hold; ``True`` once it is no longer ours on the hub."""
        assert self._client is not None
        client = self._client
        name = self.config.fence_lease(cluster)
        try:
            async with asyncio.timeout(self._request_timeout):
                current = fence
                for _attempt in range(2):
                    try:
                        if delete:
                            version = str((current.get("metadata") or {}).get("resourceVersion", ""))
                            await self._write(
                                "fence-delete",
                                functools.partial(
                                    client.delete,
                                    LEASE,
                                    name,
                                    namespace=self.config.namespace,
                                    resource_version=version,
                                ),
                            )
                        else:
                            free = released(current)
                            await self._write("fence-release", functools.partial(client.update, free))
                        return True
                    except Conflict:
                        current = await client.get(LEASE, name, namespace=self.config.namespace)
                        if holder_of(current) != self.identity:
                            return True  # not ours any more: nothing to give back
                return False
        except NotFound:
            return True
        except Exception as error:  # the next round tries again; a garbled answer is no reason to die
            log.warning(
                "sharding %s: could not release the fence of %r: %s",
                self.config.name,
                cluster,
                self._why(error),
            )
            return False

    async def _leave_group(self) -> None:
        """Graceful stop: stop all work, release every fence, withdraw the peer Lease."""
        if self._seat is None or self._client is None:
            return
        client = self._client
        for task in list(self._leaving.values()):
            task.cancel()
        await asyncio.gather(*self._leaving.values(), return_exceptions=True)
        held = list(self._fences.items())
        # Fences that still name us though we dropped them: give them back too.
        held += [
            (name, seen.lease)
            for name, seen in self._fence_seen.items()
            if seen.observed.holder == self.identity and name not in self._fences
        ]
        self._fences.clear()
        await asyncio.gather(*(self._seat.work.close(cluster) for cluster, _ in held), return_exceptions=True)
        results = await asyncio.gather(
            *(self._release(cluster, fence) for cluster, fence in held), return_exceptions=True
        )
        released_count = sum(1 for result in results if result is True)
        if self.metrics is not None:
            self.metrics.fence_releases.inc(released_count)
            self.metrics.owned.set(0)
        if self._peer_lease is not None:
            try:
                async with asyncio.timeout(self._request_timeout):
                    await self._write(
                        "peer-leave",
                        lambda: client.delete(
                            LEASE, self.config.peer_lease(self.identity), namespace=self.config.namespace
                        ),
                    )
            except NotFound:
                pass
            except Exception as error:  # shutdown goes on; survivors collect it later
                log.warning("sharding %s: could not withdraw the peer Lease: %r", self.config.name, error)
        log.info(
            "sharding %s: %s left the group (%d fences released)",
            self.config.name,
            self.identity,
            released_count,
        )
