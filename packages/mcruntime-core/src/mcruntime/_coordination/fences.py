"""Fence ownership: which shards of the fleet this replica may work on, one fence Lease each.

The fleet is split into ``ShardingConfig.shards`` shards by a hash of each
cluster's name, and a replica works on a cluster while it holds the fence of
the cluster's shard. A fence names its holder and is written only when it
changes hands: acquired (optimistic concurrency on ``resourceVersion``, so of
two contenders exactly one wins), released on handover, or deleted when its
shard has no cluster left. It stays valid, unrenewed, while its holder's peer
Lease is live (see membership.py). Fences per shard rather than per cluster
keep the writes of a failover, a handover or a cold start bounded by the
number of shards however large the fleet: a replica's third of 10,000 clusters
moves with about 85 fence writes, not 3,300. Each shard keeps its own
lifetime: losing one never waits on another.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Callable, Coroutine, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .._base.errors import AlreadyExists, Conflict, NotFound
from .._base.objects import JSON
from .lease import LEASE, Observed, holder_of, lease_object, released, take
from .membership import Membership
from .rendezvous import owner
from .shardhub import (
    API_ERRORS,
    CONCURRENT_WRITES,
    GROUP_LABEL,
    ROLE_LABEL,
    SHARD_ANNOTATION,
    SHARDS_ANNOTATION,
    HubWrites,
    ShardingConfig,
)
from .shardmap import ShardMap, named

if TYPE_CHECKING:
    from .._client.client import Client
    from .coordinator import Seat

log = logging.getLogger("mcruntime.sharding")

COLLECT_PER_ROUND = 64


@dataclass
class FenceSeen:
    """A fence Lease as last seen: its holder, since when (here), and the object (for writes)."""

    observed: Observed
    lease: JSON
    released_by: str = ""  # the holder seen last before it was released, for the line that takes it


class Fences:
    """The fences this replica holds, the ones it has seen, and handing shards over.

    ``wake`` asks the round to run again (a fence was released or taken);
    ``renewed`` wakes the watchdog, which guards a non-empty set of fences;
    ``spawn`` starts the close and handover tasks in the coordinator's task
    set, which logs one that fails and cancels what is left on leaving.
    Fences of this group that are not shard fences of this replica's count
    (per-cluster fences of an older release, or another ``shards``) are kept
    apart as ``stale`` and collected once their holder is gone.
    """

    def __init__(
        self,
        config: ShardingConfig,
        hub: HubWrites,
        membership: Membership,
        shards: ShardMap,
        *,
        wake: Callable[[], None],
        renewed: Callable[[], None],
        spawn: Callable[[Coroutine[Any, Any, None], str], asyncio.Task[None]],
    ) -> None:
        self.config = config
        self.identity = config.identity
        self.hub = hub
        self.membership = membership
        self.shards = shards
        self.wake = wake
        self.renewed = renewed
        self.seen: dict[int, FenceSeen] = {}  # shard → its fence as seen
        self.naming_us: set[int] = set()  # shards whose fence, as seen, names this replica
        self.names: dict[str, int] = {}  # fence Lease name → shard
        self.stale: dict[str, FenceSeen] = {}  # fence Lease name → a fence that is not a shard fence of ours
        self.held: dict[int, JSON] = {}  # shards whose fence we hold → the object we wrote
        self.leaving: dict[int, asyncio.Task[None]] = {}
        self.desired: set[int] = set()  # the shards the last round gave this replica
        self.seat: Seat | None = None
        self.spawn = spawn
        # Releases in flight on the hub, bounded like the round's acquisitions: a handover
        # hands over every moving shard at once, and unbounded that is a connection and TLS
        # handshake each to the hub, whose answers then come too late for all of them.
        self.releasing = asyncio.Semaphore(CONCURRENT_WRITES)

    def owned_clusters(self) -> set[str]:
        """The engaged clusters of the shards whose fence this replica holds."""
        return self.shards.clusters_of(self.held)

    def working(self, shard: int) -> set[str]:
        """Clusters of ``shard`` this replica may have work open in: engaged, or still admitted."""
        return self.working_in([shard]).get(shard, set())

    def working_in(self, shards: Iterable[int]) -> dict[int, set[str]]:
        """:meth:`working` of each of ``shards`` (those with any), in one pass over the open work.

        Cutting every shard at once (a lapse, leaving) must not scan the open
        clusters once per shard: at 10,000 clusters that is a long stall of an
        event loop that is already late.
        """
        assert self.seat is not None
        wanted = set(shards)
        found: dict[int, set[str]] = {}
        for name in self.seat.work.opened:
            shard = self.shards.shard(name)
            if shard in wanted:
                found.setdefault(shard, set()).add(name)
        for shard in wanted:
            members = self.shards.members(shard)
            if members:
                found.setdefault(shard, set()).update(members)
        return found

    def count_owned(self) -> None:
        assert self.hub.metrics is not None
        self.hub.metrics.owned.set(len(self.owned_clusters()))

    # --- what the informer tells us -------------------------------------------------------

    def observe(
        self, name: str, shard_text: str, shards_text: str, holder: str, renew_time: str, lease: JSON
    ) -> None:
        """Record a fence Lease as watched; lose the shard if another replica now holds it."""
        now = time.monotonic()
        shard = _shard_named(self.config, name, shard_text, shards_text)
        if shard is None:
            seen_stale = self.stale.get(name)
            if seen_stale is None:
                self.stale[name] = FenceSeen(Observed(holder, renew_time, now), lease)
            else:
                seen_stale.observed.see(holder, renew_time, now)
                seen_stale.lease = lease
            return
        self.names[name] = shard
        seen = self.seen.get(shard)
        if seen is None:
            self.seen[shard] = FenceSeen(Observed(holder, renew_time, now), lease)
            changed_holder = True
        else:
            changed_holder = seen.observed.holder != holder
            if changed_holder and not holder:
                seen.released_by = seen.observed.holder
            seen.observed.see(holder, renew_time, now)
            seen.lease = lease
        if holder == self.identity:
            self.naming_us.add(shard)
        else:
            self.naming_us.discard(shard)
        if changed_holder and holder != self.identity:
            if shard in self.held and shard not in self.leaving:
                self.lose(shard, f"its fence is now held by {holder or 'nobody'}")
            self.wake()  # released or taken: the owner-to-be may act

    def forget(self, name: str) -> None:
        """A fence Lease was deleted: stop work on its shard if it was ours."""
        self.stale.pop(name, None)
        shard = self.names.pop(name, None)
        if shard is None:
            return
        self.seen.pop(shard, None)
        self.naming_us.discard(shard)
        if shard in self.held and shard not in self.leaving:
            self.lose(shard, "its fence Lease was deleted")
        self.wake()

    # --- taking and losing ------------------------------------------------------------------

    async def acquire(self, shard: int, now: float) -> bool:
        """Take the fence of ``shard`` if it is free; returns whether work may start in its clusters."""
        assert self.seat is not None and self.hub.metrics is not None and self.hub.client is not None
        client = self.hub.client
        seen = self.seen.get(shard)
        if not self.membership.alive(time.monotonic()):
            return False  # never take a fence while our own peer Lease may have expired
        origin = "a new fence"
        try:
            async with asyncio.timeout(self.hub.request_timeout):
                if seen is None:
                    fresh = lease_object(
                        self.config.shard_fence(shard),
                        self.config.namespace,
                        self.identity,
                        self.config.lease_duration,
                        labels={GROUP_LABEL: self.config.name, ROLE_LABEL: "fence"},
                        annotations={
                            SHARD_ANNOTATION: str(shard),
                            SHARDS_ANNOTATION: str(self.config.shards),
                        },
                    )
                    written = await self.hub.write("fence-acquire", lambda: client.create(fresh))
                else:
                    holder = seen.observed.holder
                    if holder not in ("", self.identity) and not await self.membership.holder_silent(
                        holder, seen.observed.since, now
                    ):
                        return False
                    origin = _origin(seen, holder, self.identity, self.membership.why_silent)
                    # The watched object's resourceVersion: if anything changed since, a Conflict.
                    taken = take(seen.lease, self.identity, self.config.lease_duration)
                    written = await self.hub.write("fence-acquire", lambda: client.update(taken))
        except (AlreadyExists, Conflict, NotFound):
            return False  # another replica moved first; the informer will tell us who
        except API_ERRORS as error:
            log.warning(
                "sharding %s: could not acquire the fence of shard %d (%s): %s",
                self.config.name,
                shard,
                self.config.shard_fence(shard),
                self.hub.why(error),
            )
            return False
        assert written is not None
        self.held[shard] = written
        self.hub.metrics.fence_acquisitions.inc()
        self.renewed()  # the watchdog guards a non-empty set now
        if shard not in self.shards.in_use or shard not in self.desired:
            # Its clusters left, or it moved, while we were acquiring: give the fence straight back.
            self.leaving[shard] = self.spawn(self.hand_over(shard), f"hand back shard {shard}")
            return False
        log.info(
            "sharding %s: %s now works on shard %d (clusters %s; %s)",
            self.config.name,
            self.identity,
            shard,
            named(self.shards.members(shard)),
            origin,
        )
        return True

    def lose(self, shard: int, reason: str, working: set[str] | None = None) -> None:
        """Stop work in the clusters of ``shard`` without waiting here: the close runs as its own task.

        ``working`` is :meth:`working` of ``shard`` when the caller has it already.
        """
        assert self.seat is not None and self.hub.metrics is not None
        if self.held.pop(shard, None) is None:
            return
        self.hub.metrics.fence_losses.inc()
        self.count_owned()
        clusters = working if working is not None else self.working(shard)
        log.warning(
            "sharding %s: %s stops work on shard %d (clusters %s): %s",
            self.config.name,
            self.identity,
            shard,
            named(clusters),
            reason,
        )
        seat = self.seat
        # Another replica may work there already: writes stop now, not when the close task runs.
        seat.work.cut(clusters, f"shard group {self.config.name!r} lost shard {shard} ({reason})")

        async def close() -> None:
            try:
                await asyncio.gather(*(seat.work.close(cluster) for cluster in clusters))
            finally:
                self.leaving.pop(shard, None)
                self.wake()

        self.leaving[shard] = self.spawn(close(), f"close shard {shard}")

    async def hand_over(self, shard: int) -> None:
        """Stop work in the clusters of ``shard`` (with a short grace), then release its fence.

        The fence stays ours while our peer Lease is live, so the grace needs
        no budget against an expiry; the watchdog still cuts it short if this
        replica stops renewing.
        """
        assert self.seat is not None and self.hub.metrics is not None
        seat = self.seat
        try:
            if shard not in self.held:
                return
            grace = self.config.handover_grace
            clusters = self.working(shard)
            await asyncio.gather(*(seat.work.close(cluster, grace=grace) for cluster in clusters))
            fence = self.held.get(shard)
            if fence is None:
                return  # lost meanwhile: nothing of ours to release
            # A shard with no cluster left takes its fence along; one that moved keeps it for its new owner.
            gone = shard not in self.shards.in_use
            if await self.release(shard, fence, delete=gone):
                self.hub.metrics.fence_releases.inc()
                self._handed(shard, clusters, gone)
                self.held.pop(shard, None)
            # Otherwise keep it: the next round tries again (its work stays closed meanwhile).
        finally:
            self.leaving.pop(shard, None)
            self.count_owned()
            self.wake()

    def _handed(self, shard: int, clusters: set[str], gone: bool) -> None:
        """The line for a shard handed over: its clusters, and the peer that should take it."""
        name, identity = self.config.name, self.identity
        if gone:
            log.info("sharding %s: %s deleted the fence of shard %d: no cluster left", name, identity, shard)
            return
        successor = owner(str(shard), self.membership.live_peers(time.monotonic()))
        to = f" to {successor!r}" if successor not in (None, identity) else ""
        listed = named(clusters)
        log.info("sharding %s: %s handed shard %d (clusters %s) over%s", name, identity, shard, listed, to)

    async def give_back(self, shard: int, fence: JSON) -> None:
        """Release a fence that names us but that we do not work on (our work there is closed)."""
        try:
            assert self.seat is not None and self.hub.metrics is not None
            gone = shard not in self.shards.in_use
            if await self.release(shard, fence, delete=gone):
                self.hub.metrics.fence_releases.inc()
                log.info(
                    "sharding %s: %s gave back the fence of shard %d", self.config.name, self.identity, shard
                )
        finally:
            self.leaving.pop(shard, None)
            self.wake()

    async def release(self, shard: int, fence: JSON, *, delete: bool = False) -> bool:
        """Free (or delete) a fence we hold; ``True`` once it is no longer ours on the hub."""
        assert self.hub.client is not None
        client = self.hub.client
        name = self.config.shard_fence(shard)
        async with self.releasing:  # the wait for a turn is not the hub's time to answer
            done = await self._release(client, name, fence, delete)
        if done:
            # Not ours on the hub any more, whether or not the watch has said so yet: the
            # round must not give it back a second time meanwhile.
            self.naming_us.discard(shard)
        return done

    async def _release(self, client: Client, name: str, fence: JSON, delete: bool) -> bool:
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
                "sharding %s: could not release the fence %s: %s",
                self.config.name,
                name,
                self.hub.why(error),
            )
            return False

    def still_ours(self) -> list[tuple[int, JSON]]:
        """Fences that name this replica on the hub though it no longer works on their shards."""
        return [(shard, self.seen[shard].lease) for shard in self.naming_us - self.held.keys()]

    # --- collecting -------------------------------------------------------------------------

    async def collect_orphans(self, live: dict[str, float], now: float) -> None:
        """Delete fences of shards left without clusters while no live replica held them, and stale ones.

        A live holder deletes the fence of a shard whose last cluster left on
        handover; a fence is orphaned when its holder died first (or it was
        left released). One survivor deletes it once it has been quiet for
        ``peer_gc_after``, its shard has no cluster engaged here, and its
        holder is not a live peer; the delete names the resourceVersion
        watched, so a replica that took the fence meanwhile keeps it
        (Conflict). Deleting a fence whose clusters are merely not discovered
        here yet is harmless: its owner creates it again. Stale fences (not
        shard fences of this group's count) go by the same rule, whatever
        their cluster: nobody of this count ever takes them.
        """
        assert self.seat is not None
        # Only fences of shards not in use can be orphans: a set difference first. The
        # deletes of one round are bounded (the 10,000 per-cluster fences a 1.0 group
        # leaves behind go over several rounds, not in one that holds up the next).
        candidates = self.seen.keys() - self.shards.in_use.keys() - self.held.keys() - self.leaving.keys()
        found = [(self.config.shard_fence(shard), self.seen.get(shard)) for shard in candidates]
        found.extend(self.stale.items())
        budget = COLLECT_PER_ROUND
        for name, seen in found:
            if seen is not None and await self._collect(name, seen, live, now):
                budget -= 1
                if budget == 0:
                    return

    async def _collect(self, name: str, seen: FenceSeen, live: dict[str, float], now: float) -> bool:
        """Delete one fence if it is an orphan and this replica is the one to collect it; whether it tried."""
        holder = seen.observed.holder
        if (
            (holder and (holder in live or holder == self.identity))
            or seen.observed.quiet_for(now) <= self.config.peer_gc_after
            or owner(f"fence-gc\x00{name}", live) != self.identity
        ):
            return False
        if await self.hub.delete_as_seen("fence-gc", seen.lease, "an orphaned fence"):
            log.info(
                "sharding %s: deleted the fence %s (no cluster left, holder %s), quiet for %.0fs",
                self.config.name,
                name,
                holder or "none",
                seen.observed.quiet_for(now),
            )
        return True


def _shard_named(config: ShardingConfig, name: str, shard_text: str, shards_text: str) -> int | None:
    """The shard a fence Lease guards, if it is a shard fence of this group's count; else ``None``."""
    if shards_text != str(config.shards) or not shard_text.isdigit() or len(shard_text) > 4:
        return None
    shard = int(shard_text)
    if shard >= config.shards or name != config.shard_fence(shard):
        return None
    return shard


def _origin(seen: FenceSeen, holder: str, identity: str, why_silent: dict[str, str]) -> str:
    """Where a fence about to be taken comes from, for the line that says this replica took it."""
    if holder == identity:
        return "its fence already named this replica"
    if not holder:
        return f"released by {seen.released_by!r}" if seen.released_by else "a free fence"
    return f"taken from {holder!r}, which counts as dead: {why_silent.get(holder, 'silent for a full term')}"
