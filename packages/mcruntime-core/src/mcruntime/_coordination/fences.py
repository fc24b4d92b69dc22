"""Fence ownership: which clusters this replica may work on, held through one fence Lease each.

A fence names its holder and is written only when it changes hands: acquired
(optimistic concurrency on ``resourceVersion``, so of two contenders exactly
one wins), released on handover, or deleted with its cluster. It stays valid,
unrenewed, while its holder's peer Lease is live (see membership.py). Each
cluster's fence, and therefore its work, keeps its own lifetime: losing one
cluster never waits on another.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .._base.errors import AlreadyExists, Conflict, NotFound
from .._base.objects import JSON
from .lease import LEASE, Observed, holder_of, lease_object, released, take
from .membership import Membership
from .rendezvous import owner
from .shardhub import (
    API_ERRORS,
    CLUSTER_ANNOTATION,
    CONCURRENT_WRITES,
    GROUP_LABEL,
    ROLE_LABEL,
    HubWrites,
    ShardingConfig,
)

if TYPE_CHECKING:
    from .._client.client import Client
    from .coordinator import Seat

log = logging.getLogger("mcruntime.sharding")


@dataclass
class FenceSeen:
    """A fence Lease as last seen: its holder, since when (here), and the object (for writes)."""

    observed: Observed
    lease: JSON


class Fences:
    """The fences this replica holds, the ones it has seen, and handing clusters over.

    ``wake`` asks the round to run again (a fence was released or taken);
    ``renewed`` wakes the watchdog, which guards a non-empty set of fences.
    """

    def __init__(
        self,
        config: ShardingConfig,
        hub: HubWrites,
        membership: Membership,
        *,
        wake: Callable[[], None],
        renewed: Callable[[], None],
    ) -> None:
        self.config = config
        self.identity = config.identity
        self.hub = hub
        self.membership = membership
        self.wake = wake
        self.renewed = renewed
        self.seen: dict[str, FenceSeen] = {}  # cluster → its fence as seen
        self.naming_us: set[str] = set()  # clusters whose fence, as seen, names this replica
        self.names: dict[str, str] = {}  # fence Lease name → cluster
        self.held: dict[str, JSON] = {}  # clusters whose fence we hold → the object we wrote
        self.leaving: dict[str, asyncio.Task[None]] = {}
        self.desired: set[str] = set()  # the clusters the last round gave this replica
        self.seat: Seat | None = None
        # Releases in flight on the hub, bounded like the round's acquisitions: a handover
        # hands over every moving cluster at once (2,500 at 10,000 clusters going from three
        # replicas to four), and unbounded that is a connection and TLS handshake each to
        # the hub, whose answers then come too late for all of them.
        self.releasing = asyncio.Semaphore(CONCURRENT_WRITES)

    # --- what the informer tells us -------------------------------------------------------

    def observe(self, name: str, cluster: str, holder: str, renew_time: str, lease: JSON) -> None:
        """Record a fence Lease as watched; lose the cluster if another replica now holds it."""
        if name != self.config.fence_lease(cluster):
            return  # its annotation names another cluster than its name: not a fence of ours
        now = time.monotonic()
        self.names[name] = cluster
        seen = self.seen.get(cluster)
        if seen is None:
            self.seen[cluster] = FenceSeen(Observed(holder, renew_time, now), lease)
            changed_holder = True
        else:
            changed_holder = seen.observed.holder != holder
            seen.observed.see(holder, renew_time, now)
            seen.lease = lease
        if holder == self.identity:
            self.naming_us.add(cluster)
        else:
            self.naming_us.discard(cluster)
        if changed_holder and holder != self.identity:
            if cluster in self.held and cluster not in self.leaving:
                self.lose(cluster, f"its fence is now held by {holder or 'nobody'}")
            self.wake()  # released or taken: the owner-to-be may act

    def forget(self, name: str) -> None:
        """A fence Lease was deleted: stop work on its cluster if it was ours."""
        cluster = self.names.pop(name, None)
        if cluster is None:
            return
        self.seen.pop(cluster, None)
        self.naming_us.discard(cluster)
        if cluster in self.held and cluster not in self.leaving:
            self.lose(cluster, "its fence Lease was deleted")
        self.wake()

    # --- taking and losing ------------------------------------------------------------------

    async def acquire(self, cluster: str, now: float) -> bool:
        """Take the fence of ``cluster`` if it is free; returns whether work may start there."""
        assert self.seat is not None and self.hub.metrics is not None and self.hub.client is not None
        client = self.hub.client
        seen = self.seen.get(cluster)
        if not self.membership.alive(time.monotonic()):
            return False  # never take a fence while our own peer Lease may have expired
        try:
            async with asyncio.timeout(self.hub.request_timeout):
                if seen is None:
                    fresh = lease_object(
                        self.config.fence_lease(cluster),
                        self.config.namespace,
                        self.identity,
                        self.config.lease_duration,
                        labels={GROUP_LABEL: self.config.name, ROLE_LABEL: "fence"},
                        annotations={CLUSTER_ANNOTATION: cluster},
                    )
                    written = await self.hub.write("fence-acquire", lambda: client.create(fresh))
                else:
                    holder = seen.observed.holder
                    if holder not in ("", self.identity) and not await self.membership.holder_silent(
                        holder, seen.observed.since, now
                    ):
                        return False
                    # The watched object's resourceVersion: if anything changed since, a Conflict.
                    taken = take(seen.lease, self.identity, self.config.lease_duration)
                    written = await self.hub.write("fence-acquire", lambda: client.update(taken))
        except (AlreadyExists, Conflict, NotFound):
            return False  # another replica moved first; the informer will tell us who
        except API_ERRORS as error:
            log.warning(
                "sharding %s: could not acquire the fence of %r: %s",
                self.config.name,
                cluster,
                self.hub.why(error),
            )
            return False
        assert written is not None
        self.held[cluster] = written
        self.hub.metrics.fence_acquisitions.inc()
        self.renewed()  # the watchdog guards a non-empty set now
        if cluster not in self.seat.clusters() or cluster not in self.desired:
            # It left, or moved, while we were acquiring: give the fence straight back.
            self.leaving[cluster] = asyncio.create_task(self.hand_over(cluster))
            return False
        log.info("sharding %s: %s now works on cluster %r", self.config.name, self.identity, cluster)
        return True

    def lose(self, cluster: str, reason: str) -> None:
        """Stop work on ``cluster`` without waiting here: the close runs as its own task."""
        assert self.seat is not None and self.hub.metrics is not None
        if self.held.pop(cluster, None) is None:
            return
        self.hub.metrics.fence_losses.inc()
        self.hub.metrics.owned.set(len(self.held))
        log.warning(
            "sharding %s: %s stops work on cluster %r: %s", self.config.name, self.identity, cluster, reason
        )
        seat = self.seat

        async def close() -> None:
            try:
                await seat.work.close(cluster)
            finally:
                self.leaving.pop(cluster, None)
                self.wake()

        self.leaving[cluster] = asyncio.create_task(close())

    async def hand_over(self, cluster: str) -> None:
        """Stop work in ``cluster`` (with a short grace), then release its fence for the new owner.

        The fence stays ours while our peer Lease is live, so the grace needs
        no budget against an expiry; the watchdog still cuts it short if this
        replica stops renewing.
        """
        assert self.seat is not None and self.hub.metrics is not None
        try:
            if cluster not in self.held:
                return
            await self.seat.work.close(cluster, grace=self.config.handover_grace)
            fence = self.held.get(cluster)
            if fence is None:
                return  # lost meanwhile: nothing of ours to release
            # A cluster that left the fleet takes its fence along; one that moved keeps it for its new owner.
            gone = cluster not in self.seat.clusters()
            if await self.release(cluster, fence, delete=gone):
                self.hub.metrics.fence_releases.inc()
                log.info("sharding %s: %s handed cluster %r over", self.config.name, self.identity, cluster)
                self.held.pop(cluster, None)
            # Otherwise keep it: the next round tries again (its work stays closed meanwhile).
        finally:
            self.leaving.pop(cluster, None)
            self.hub.metrics.owned.set(len(self.held))
            self.wake()

    async def give_back(self, cluster: str, fence: JSON) -> None:
        """Release a fence that names us but that we do not work on (our work there is closed)."""
        try:
            assert self.seat is not None and self.hub.metrics is not None
            gone = cluster not in self.seat.clusters()
            if await self.release(cluster, fence, delete=gone):
                self.hub.metrics.fence_releases.inc()
                log.info(
                    "sharding %s: %s gave back the fence of %r", self.config.name, self.identity, cluster
                )
        finally:
            self.leaving.pop(cluster, None)
            self.wake()

    async def release(self, cluster: str, fence: JSON, *, delete: bool = False) -> bool:
        """Free (or delete) a fence we hold; ``True`` once it is no longer ours on the hub."""
        assert self.hub.client is not None
        client = self.hub.client
        name = self.config.fence_lease(cluster)
        async with self.releasing:  # the wait for a turn is not the hub's time to answer
            done = await self._release(client, cluster, name, fence, delete)
        if done:
            # Not ours on the hub any more, whether or not the watch has said so yet: the
            # round must not give it back a second time meanwhile.
            self.naming_us.discard(cluster)
        return done

    async def _release(self, client: Client, cluster: str, name: str, fence: JSON, delete: bool) -> bool:
        try:
            async with asyncio.timeout(self.hub.request_timeout):
                current = fence
                for _attempt in range(2):
                    try:
                        if delete:
                            version = str((current.get("metadata") or {}).get("resourceVersion", ""))
                            await self.hub.write(
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
                            await self.hub.write("fence-release", functools.partial(client.update, free))
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
                self.hub.why(error),
            )
            return False

    def still_ours(self) -> list[tuple[str, JSON]]:
        """Fences that name this replica on the hub though it no longer works on their clusters."""
        return [(name, self.seen[name].lease) for name in self.naming_us - self.held.keys()]

    # --- collecting -------------------------------------------------------------------------

    async def collect_orphans(self, live: dict[str, float], now: float) -> None:
        """Delete fences of clusters that left the fleet while no live replica held them.

        A live holder deletes a departed cluster's fence itself on handover; a
        fence is orphaned when its holder died first (or it was left released).
        One survivor deletes it once it has been quiet for ``peer_gc_after``,
        its cluster is not engaged here, and its holder is not a live peer; the
        delete names the resourceVersion watched, so a replica that took the
        fence meanwhile keeps it (Conflict). Deleting a fence whose cluster is
        merely not discovered here yet is harmless: its owner creates it again.
        """
        assert self.seat is not None
        # Only fences of clusters not engaged here can be orphans: a set difference first,
        # not a look at each of 10,000 fences every round.
        candidates = self.seen.keys() - self.seat.clusters().keys() - self.held.keys() - self.leaving.keys()
        for cluster in candidates:
            seen = self.seen.get(cluster)
            if seen is None:
                continue  # forgotten while an earlier delete ran
            holder = seen.observed.holder
            if (
                (holder and (holder in live or holder == self.identity))
                or seen.observed.quiet_for(now) <= self.config.peer_gc_after
                or owner(f"fence-gc\x00{cluster}", live) != self.identity
            ):
                continue
            if not await self.hub.delete_as_seen("fence-gc", seen.lease, "an orphaned fence"):
                continue
            log.info(
                "sharding %s: deleted the fence of %r (cluster gone, holder %s), quiet for %.0fs",
                self.config.name,
                cluster,
                holder or "none",
                seen.observed.quiet_for(now),
            )
