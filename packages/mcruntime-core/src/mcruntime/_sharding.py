"""Sharding the fleet across replicas with Leases on the hub.

Peers announce themselves with one Lease each, renewed every
``retry_period``; a peer whose Lease has not changed for ``lease_duration``
(as observed locally: clocks are never compared) has dropped out. Every replica
computes the same owner for every cluster by weighted rendezvous hashing over
the live peers, so when a peer goes only its clusters move, and a new peer
takes about ``1/n`` of the clusters, from everyone in proportion.

Owning is not enough to write: a replica works on a cluster only while it
holds that cluster's *fence*, a Lease of its own. It acquires a fence that is
free, released, or expired by local observation; it renews its fences every
``retry_period`` and, if a fence cannot be renewed for ``renew_deadline``,
stops that cluster's work before anyone else could see the fence expire. When
ownership moves, the old owner stops work (in-flight reconciles get a short
grace) and only then releases the fence, which the new owner, woken by the
release, takes at once. Each cluster's fence, and therefore its work, has its
own lifetime: no cluster's work depends on another cluster's.

Failover after a crash therefore takes ``lease_duration`` plus at most one
``retry_period``; a graceful stop releases everything and hands over within a
round trip.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import re
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from prometheus_client import Counter, Gauge

from ._errors import AlreadyExists, APIError, Conflict, NotFound, Unreachable
from ._informer import ResourceEventHandler
from ._leaderelection import LEASE, _micro_time, default_identity
from ._objects import JSON
from ._rendezvous import owner

if TYPE_CHECKING:
    from ._client import Client
    from ._cluster import Cluster
    from ._coordinator import Seat

log = logging.getLogger("mcruntime.sharding")

GROUP_LABEL = "mcruntime.dev/shard-group"
ROLE_LABEL = "mcruntime.dev/shard-role"
CLUSTER_ANNOTATION = "mcruntime.dev/cluster"
WEIGHT_ANNOTATION = "mcruntime.dev/weight"
_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]{0,38}[a-z0-9])?$")
_API_ERRORS = (APIError, Unreachable, OSError, TimeoutError)


@dataclass(frozen=True)
class ShardingConfig:
    """Where the Leases live, who this replica is, and how fast work moves.

    ``name`` names the group: every replica of one controller uses the same
    name and namespace. ``weight`` is this replica's relative share.
    ``handover_grace`` is how long in-flight reconciles of a cluster that moves
    to another replica may run before they are cancelled.
    """

    name: str = "mcruntime"
    namespace: str = "default"
    identity: str = field(default_factory=default_identity)
    weight: float = 1.0
    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0
    handover_grace: float = 5.0

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

    def peer_lease(self, identity: str) -> str:
        return f"{self.name}-peer-{_digest(identity)}"

    def fence_lease(self, cluster: str) -> str:
        return f"{self.name}-fence-{_digest(cluster)}"


def _digest(text: str) -> str:
    return hashlib.blake2b(text.encode(), digest_size=8).hexdigest()


@dataclass
class _Seen:
    """A Lease as this replica last saw it, and when its holder or renewal last changed."""

    role: str
    holder: str
    renew_time: str
    changed_at: float
    weight: float = 1.0
    cluster: str = ""


@dataclass
class _Fence:
    """A fence this replica holds: the last object it wrote and when it last renewed."""

    lease: JSON
    renewed_at: float


class _TakenOver(Exception):
    """Another replica holds a fence this replica thought it held."""


class ShardMetrics:
    """What an operator watches: how many clusters this replica owns and how often that changes."""

    def __init__(self, registry: Any) -> None:
        self.owned = Gauge(
            "mcruntime_shard_clusters_owned",
            "Clusters whose fence this replica holds",
            registry=registry,
        )
        self.peers = Gauge("mcruntime_shard_peers", "Live peers in the shard group", registry=registry)
        self.ownership_changes = Counter(
            "mcruntime_shard_ownership_changes_total",
            "Clusters that became or stopped being this replica's by rendezvous hashing",
            ["direction"],
            registry=registry,
        )
        self.fence_acquisitions = Counter(
            "mcruntime_shard_fence_acquisitions_total", "Fences this replica acquired", registry=registry
        )
        self.fence_releases = Counter(
            "mcruntime_shard_fence_releases_total",
            "Fences this replica released on handover or shutdown",
            registry=registry,
        )
        self.fence_losses = Counter(
            "mcruntime_shard_fence_losses_total",
            "Fences lost: not renewed within renew_deadline, or taken over",
            registry=registry,
        )


class ShardedCoordinator:
    """Splits the engaged clusters between replicas; pass it as ``Manager(coordinator=...)``.

    Every replica keeps its providers and caches running for every cluster
    (warm standby): ownership changes only open and close work.
    """

    def __init__(self, config: ShardingConfig | None = None) -> None:
        self.config = config or ShardingConfig()
        self._seen: dict[str, _Seen] = {}
        self._fences: dict[str, _Fence] = {}
        self._leaving: dict[str, asyncio.Task[None]] = {}
        self._peer_lease: JSON | None = None
        self._peer_renewed_at: float | None = None
        self._desired: set[str] = set()
        self._wake = asyncio.Event()
        self._seat: Seat | None = None
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
        """Campaign for this replica's share until cancelled; then release everything."""
        hub = seat.local
        if hub is None:
            raise ValueError("sharding needs a local cluster (the hub) to hold its Leases")
        self._seat = seat
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
        try:
            while not await informer.wait_for_sync(self.config.lease_duration):
                log.warning("sharding %s: the Lease cache on the hub has not synced yet", self.config.name)
            # Announce first and let replicas that start together see each other before
            # anyone acquires fences, so a cold start does not move every cluster twice.
            await self._renew_peer(hub.client)
            await asyncio.sleep(self.config.retry_period)
            while True:
                await self._round(hub.client)
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self.config.retry_period):
                        await self._wake.wait()
        finally:
            registration.remove()
            with contextlib.suppress(ValueError):
                seat.engage_listeners.remove(self._cluster_changed)
            with contextlib.suppress(ValueError):
                seat.disengage_listeners.remove(self._cluster_changed)
            await asyncio.shield(self._leave_group(hub.client))

    def _cluster_changed(self, _name: str, _cluster: Cluster) -> None:
        self._wake.set()

    def _observe(self, lease: JSON) -> None:
        meta = lease.get("metadata") or {}
        spec = lease.get("spec") or {}
        labels = meta.get("labels") or {}
        annotations = meta.get("annotations") or {}
        name = str(meta.get("name", ""))
        holder = str(spec.get("holderIdentity") or "")
        renew_time = str(spec.get("renewTime") or "")
        role = str(labels.get(ROLE_LABEL, ""))
        previous = self._seen.get(name)
        changed = previous is None or (previous.holder, previous.renew_time) != (holder, renew_time)
        try:
            weight = float(annotations.get(WEIGHT_ANNOTATION, "1"))
        except ValueError:
            weight = 1.0
        self._seen[name] = _Seen(
            role=role,
            holder=holder,
            renew_time=renew_time,
            changed_at=time.monotonic() if changed or previous is None else previous.changed_at,
            weight=weight if weight > 0 else 1.0,
            cluster=str(annotations.get(CLUSTER_ANNOTATION, "")),
        )
        # Our own renewals change nothing here; a peer coming, going or releasing does.
        if (role == "peer" and (previous is None or previous.holder != holder)) or (
            role == "fence" and holder != self.identity and (previous is None or previous.holder != holder)
        ):
            self._wake.set()

    def _forget(self, lease: JSON) -> None:
        name = str((lease.get("metadata") or {}).get("name", ""))
        if self._seen.pop(name, None) is not None:
            self._wake.set()

    def _live_peers(self, now: float) -> dict[str, float]:
        peers: dict[str, float] = {}
        for seen in self._seen.values():
            if seen.role != "peer" or not seen.holder or seen.holder == self.identity:
                continue
            if now - seen.changed_at <= self.config.lease_duration:
                peers[seen.holder] = seen.weight
        renewed = self._peer_renewed_at
        if renewed is not None and now - renewed < self.config.renew_deadline:
            peers[self.identity] = self.config.weight
        return peers

    async def _round(self, client: Client) -> None:
        assert self._seat is not None and self.metrics is not None
        await self._renew_peer(client)
        now = time.monotonic()
        peers = self._live_peers(now)
        self.metrics.peers.set(len(peers))
        clusters = self._seat.clusters()
        desired = {name for name in clusters if owner(name, peers) == self.identity}
        self.metrics.ownership_changes.labels("gained").inc(len(desired - self._desired))
        self.metrics.ownership_changes.labels("lost").inc(len(self._desired - desired))
        self._desired = desired
        for name in list(self._fences):
            if name not in desired and name not in self._leaving:
                self._leaving[name] = asyncio.create_task(self._hand_over(client, name))
        held = [name for name in self._fences if name not in self._leaving]
        wanted = [name for name in desired if name not in self._fences and name not in self._leaving]
        results = await asyncio.gather(
            *(self._acquire_fence(client, name) for name in wanted),
            *(self._renew_fence(client, name) for name in held),
        )
        acquired = [name for name, won in zip(wanted, results, strict=False) if won]
        if acquired:
            # One replay for everything won this round, not one per cluster.
            self._seat.work.open(*acquired)
        self.metrics.owned.set(len(self._fences))

    # --- the peer Lease ---------------------------------------------------------------------

    def _lease_object(self, name: str, role: str, annotations: dict[str, str]) -> JSON:
        now = _micro_time()
        return {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {
                "name": name,
                "namespace": self.config.namespace,
                "labels": {GROUP_LABEL: self.config.name, ROLE_LABEL: role},
                "annotations": annotations,
            },
            "spec": {
                "holderIdentity": self.identity,
                "leaseDurationSeconds": max(1, round(self.config.lease_duration)),
                "acquireTime": now,
                "renewTime": now,
                "leaseTransitions": 0,
            },
        }

    async def _renew_peer(self, client: Client) -> None:
        started = time.monotonic()
        try:
            async with asyncio.timeout(self.config.retry_period):
                if self._peer_lease is None:
                    self._peer_lease = await self._create_or_take_peer(client)
                else:
                    lease = dict(self._peer_lease)
                    lease["spec"] = {**(lease.get("spec") or {}), "renewTime": _micro_time()}
                    self._peer_lease = await client.update(lease)
            self._peer_renewed_at = started
        except Conflict:
            self._peer_lease = None  # someone touched it; read it again next round
        except NotFound:
            self._peer_lease = None
        except _API_ERRORS as error:
            log.warning("sharding %s: could not renew this replica's peer Lease: %s", self.config.name, error)

    async def _create_or_take_peer(self, client: Client) -> JSON:
        name = self.config.peer_lease(self.identity)
        fresh = self._lease_object(name, "peer", {WEIGHT_ANNOTATION: repr(self.config.weight)})
        try:
            return await client.create(fresh)
        except AlreadyExists:
            current = await client.get(LEASE, name, namespace=self.config.namespace)
            current["metadata"]["annotations"] = fresh["metadata"]["annotations"]
            current["spec"] = {**(current.get("spec") or {}), **fresh["spec"]}
            return await client.update(current)

    # --- fences -----------------------------------------------------------------------------

    def _fence_free(self, name: str, now: float) -> bool:
        seen = self._seen.get(self.config.fence_lease(name))
        if seen is None or not seen.holder or seen.holder == self.identity:
            return True
        return now - seen.changed_at > self.config.lease_duration

    def _expired_as_seen(self, name: str, spec: JSON) -> bool:
        """Whether the Lease just read is the one the informer has watched unchanged for a full term.

        A holder or renewal we have not watched for ``lease_duration`` may be
        a fresh acquisition by another replica: never take it.
        """
        seen = self._seen.get(name)
        if seen is None:
            return False
        current = (str(spec.get("holderIdentity") or ""), str(spec.get("renewTime") or ""))
        if (seen.holder, seen.renew_time) != current:
            return False
        return time.monotonic() - seen.changed_at > self.config.lease_duration

    async def _acquire_fence(self, client: Client, cluster: str) -> bool:
        """Take the fence of ``cluster`` if it is free; returns whether work may start there."""
        assert self._seat is not None and self.metrics is not None
        started = time.monotonic()
        if not self._fence_free(cluster, started):
            return False
        name = self.config.fence_lease(cluster)
        try:
            async with asyncio.timeout(self.config.retry_period):
                try:
                    current = await client.get(LEASE, name, namespace=self.config.namespace)
                except NotFound:
                    fresh = self._lease_object(name, "fence", {CLUSTER_ANNOTATION: cluster})
                    written = await client.create(fresh)
                else:
                    spec = dict(current.get("spec") or {})
                    holder = str(spec.get("holderIdentity") or "")
                    if holder not in ("", self.identity) and not self._expired_as_seen(name, spec):
                        return False
                    now = _micro_time()
                    if holder != self.identity:
                        spec["leaseTransitions"] = int(str(spec.get("leaseTransitions") or 0)) + 1
                        spec["acquireTime"] = now
                    spec.update(
                        holderIdentity=self.identity,
                        leaseDurationSeconds=max(1, round(self.config.lease_duration)),
                        renewTime=now,
                    )
                    current["spec"] = spec
                    written = await client.update(current)
        except (AlreadyExists, Conflict):
            return False  # another replica moved first; the informer will tell us who
        except _API_ERRORS as error:
            log.warning(
                "sharding %s: could not acquire the fence of %r: %s", self.config.name, cluster, error
            )
            return False
        self._fences[cluster] = _Fence(written, started)
        self.metrics.fence_acquisitions.inc()
        if cluster not in self._seat.clusters() or cluster not in self._desired:
            # It left, or moved, while we were acquiring: give the fence straight back.
            self._leaving[cluster] = asyncio.create_task(self._hand_over(client, cluster))
            return False
        log.info("sharding %s: %s now works on cluster %r", self.config.name, self.identity, cluster)
        return True

    async def _renew_fence(self, client: Client, cluster: str) -> None:
        fence = self._fences.get(cluster)
        if fence is None:
            return
        started = time.monotonic()
        if started - fence.renewed_at < self.config.retry_period * 0.75:
            return
        name = self.config.fence_lease(cluster)
        try:
            async with asyncio.timeout(self.config.retry_period):
                lease = dict(fence.lease)
                lease["spec"] = {**(lease.get("spec") or {}), "renewTime": _micro_time()}
                try:
                    written = await client.update(lease)
                except Conflict:
                    current = await client.get(LEASE, name, namespace=self.config.namespace)
                    holder = str((current.get("spec") or {}).get("holderIdentity") or "")
                    if holder != self.identity:
                        raise _TakenOver(holder or "nobody") from None
                    current["spec"] = {**(current.get("spec") or {}), "renewTime": _micro_time()}
                    written = await client.update(current)
        except _TakenOver as taken:
            await self._lose(cluster, f"its fence was taken over by {taken}")
            return
        except NotFound:
            reason = "its fence Lease was deleted"
        except (Conflict, *_API_ERRORS) as error:
            reason = str(error) or type(error).__name__
        else:
            fence.lease = written
            fence.renewed_at = started
            return
        if time.monotonic() - fence.renewed_at >= self.config.renew_deadline - self.config.retry_period:
            await self._lose(
                cluster, f"could not renew its fence within {self.config.renew_deadline:.0f}s ({reason})"
            )

    async def _lose(self, cluster: str, reason: str) -> None:
        assert self._seat is not None and self.metrics is not None
        if self._fences.pop(cluster, None) is None:
            return
        self.metrics.fence_losses.inc()
        log.warning(
            "sharding %s: %s stops work on cluster %r: %s", self.config.name, self.identity, cluster, reason
        )
        await self._seat.work.close(cluster)

    async def _hand_over(self, client: Client, cluster: str) -> None:
        """Stop work in ``cluster`` (with a short grace), then release its fence for the new owner."""
        assert self._seat is not None and self.metrics is not None
        try:
            fence = self._fences.get(cluster)
            if fence is None:
                return
            # In-flight work must end well before the fence could expire elsewhere.
            budget = (
                self.config.renew_deadline - self.config.retry_period - (time.monotonic() - fence.renewed_at)
            )
            await self._seat.work.close(cluster, grace=max(0.0, min(self.config.handover_grace, budget)))
            # A cluster that left the fleet takes its fence along; one that moved keeps it for its new owner.
            gone = cluster not in self._seat.clusters()
            if await self._release(client, cluster, fence, delete=gone):
                self.metrics.fence_releases.inc()
                log.info("sharding %s: %s handed cluster %r over", self.config.name, self.identity, cluster)
            self._fences.pop(cluster, None)
        finally:
            self._leaving.pop(cluster, None)
            self._wake.set()

    async def _release(self, client: Client, cluster: str, fence: _Fence, *, delete: bool = False) -> bool:
        name = str(fence.lease["metadata"]["name"])
        try:
            async with asyncio.timeout(self.config.retry_period):
                try:
                    current = await client.get(LEASE, name, namespace=self.config.namespace)
                except NotFound:
                    return False
                spec = dict(current.get("spec") or {})
                if spec.get("holderIdentity") != self.identity:
                    return False
                if delete:
                    version = str(current["metadata"].get("resourceVersion", ""))
                    await client.delete(
                        LEASE, name, namespace=self.config.namespace, resource_version=version
                    )
                    return True
                spec.update(holderIdentity="", leaseDurationSeconds=1, renewTime=_micro_time())
                current["spec"] = spec
                await client.update(current)
                return True
        except (Conflict, *_API_ERRORS) as error:
            log.warning(
                "sharding %s: could not release the fence of %r: %s", self.config.name, cluster, error
            )
            return False

    async def _leave_group(self, client: Client) -> None:
        """Graceful stop: stop all work, release every fence, withdraw the peer Lease."""
        assert self._seat is not None
        for task in list(self._leaving.values()):
            task.cancel()
        await asyncio.gather(*self._leaving.values(), return_exceptions=True)
        held = list(self._fences.items())
        self._fences.clear()
        await asyncio.gather(*(self._seat.work.close(cluster) for cluster, _ in held))
        released = await asyncio.gather(*(self._release(client, cluster, fence) for cluster, fence in held))
        if self.metrics is not None:
            self.metrics.fence_releases.inc(sum(released))
            self.metrics.owned.set(0)
        if self._peer_lease is not None:
            with contextlib.suppress(NotFound, *_API_ERRORS):
                async with asyncio.timeout(self.config.retry_period):
                    await client.delete(
                        LEASE, self.config.peer_lease(self.identity), namespace=self.config.namespace
                    )
        log.info(
            "sharding %s: %s left the group (%d fences released)",
            self.config.name,
            self.identity,
            sum(released),
        )
