"""What the sharding round tells the log about the group: who died, and which clusters wait on whom.

An on-call engineer asks "who works on cluster m1 now, and why did it stop
for a while?". The fence lines (taken, handed over, lost) name their clusters;
these name the rest, once per change and never per round:

- a peer that counts as gone (silent for a term here, named silent by a peer,
  or its Lease deleted) and the shards and clusters it held, which move;
- shards this replica should take but whose fence still names a peer that no
  longer counts as live and has not been silent for a full term yet;
- free fences that the peer this replica counts as their owner has not
  taken: the sign that replicas disagree about who is live.

Each list is bounded: a few names and how many more.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping

from .fences import Fences
from .membership import Membership
from .rendezvous import owner
from .shardhub import ShardingConfig
from .shardmap import ShardMap, named

log = logging.getLogger("mcruntime.sharding")


class GroupLog:
    """Remembers what it said about the group, so each change is said once."""

    def __init__(self, config: ShardingConfig, members: Membership, fences: Fences, shards: ShardMap) -> None:
        self.config = config
        self.members = members
        self.fences = fences
        self.shards = shards
        self.counted: set[str] | None = None  # the other peers counted live at the last look
        self.waiting_on: set[str] = set()  # dead holders whose fences we wait for, as said
        self.untaken: set[str] = set()  # owners of free fences that do not take them, as said
        self.looked_at = float("-inf")

    def peers(self, live: Mapping[str, float], now: float) -> None:
        """Say which peers stopped or started counting as live since the last look.

        Only while this replica is alive: without its own renewals it may not
        hear the hub, and every peer would look gone to it. At the first look,
        the peer Leases found that do not count as live are said gone (a
        crashed replica's leftover Lease).
        """
        members = self.members
        current = set(live) - {self.config.identity}
        first = self.counted is None
        before = set(members.peers) - {self.config.identity} if self.counted is None else self.counted
        self.counted = current
        for identity in sorted(before - current):
            held = [shard for shard, seen in self.fences.seen.items() if seen.observed.holder == identity]
            if held:
                clusters = self.shards.clusters_of(held)
                moving = f"what it holds moves: shards {named(held)} (clusters {named(clusters)})"
            else:
                moving = "it holds no fence"
            level = logging.WARNING if held and not first else logging.INFO
            log.log(
                level,
                "sharding %s: peer %r counts as gone: %s; %s",
                self.config.name,
                identity,
                self._why_gone(identity, now),
                moving,
            )
        if not first:
            for identity in sorted(current - before):
                log.info("sharding %s: peer %r counts as live", self.config.name, identity)

    def _why_gone(self, identity: str, now: float) -> str:
        members = self.members
        peer = members.peers.get(identity)
        if peer is None:
            return "its peer Lease was deleted (it left the group, or was collected)"
        claimant = members.silenced_by(identity)
        if claimant is not None:
            return (
                f"its peer Lease has not changed since peer {claimant!r} found it silent for a full "
                f"term ({self.config.lease_duration:g}s)"
            )
        return (
            f"its peer Lease has not been renewed for {members.quiet(peer, now):.1f}s here "
            f"(lease_duration {self.config.lease_duration:g}s)"
        )

    def waiting(self, wanted: Iterable[int], live: Mapping[str, float], now: float) -> None:
        """Say which shards this replica wants but may not take yet: their holder is gone, not a term ago."""
        fences = self.fences
        waits: dict[str, list[int]] = {}
        for shard in wanted:
            seen = fences.seen.get(shard)
            holder = "" if seen is None else seen.observed.holder
            if shard in fences.held or not holder or holder == self.config.identity or holder in live:
                continue
            waits.setdefault(holder, []).append(shard)
        for holder in sorted(waits.keys() - self.waiting_on):
            shards = waits[holder]
            seen_at = max(fences.seen[shard].observed.since for shard in shards)
            sign = now - self.members.last_sign_of_life(holder, seen_at)
            if self.config.lease_duration - sign < self.config.retry_period:
                continue  # taken by the next round or so: nothing worth a line
            log.info(
                "sharding %s: shards %s (clusters %s) wait for peer %r, whose fences they are: it no longer "
                "counts as live, but its last sign of life here is %.1fs old, and a fence is taken only "
                "after a full term (%gs) so that its holder has stopped",
                self.config.name,
                named(shards),
                named(self.shards.clusters_of(shards)),
                holder,
                sign,
                self.config.lease_duration,
            )
        self.waiting_on = set(waits)

    def free_fences(self, live: Mapping[str, float], now: float) -> None:
        """Once per retry period: say which free fences their owner (as counted here) leaves untaken.

        A released fence is taken by its new owner at once, woken by the
        release. One that stays free for two retry periods means the owner
        counts the peers differently (a peer this replica counts as dead is
        live to it, say): its clusters have no worker meanwhile.
        """
        if now - self.looked_at < self.config.retry_period:
            return
        self.looked_at = now
        limit = 2 * self.config.retry_period
        untaken: dict[str, list[int]] = {}
        for shard in self.shards.in_use:
            seen = self.fences.seen.get(shard)
            if seen is None or seen.observed.holder or seen.observed.quiet_for(now) <= limit:
                continue
            chosen = owner(str(shard), live)
            if chosen is not None and chosen != self.config.identity:
                untaken.setdefault(chosen, []).append(shard)
        for chosen in sorted(untaken.keys() - self.untaken):
            shards = untaken[chosen]
            log.warning(
                "sharding %s: shards %s (clusters %s) have had a free fence for over %gs, and nobody "
                "works on them: peer %r, their owner among the live peers as counted here (%s), has not "
                "taken them; it may count a peer as live that this replica counts as gone (see its log)",
                self.config.name,
                named(shards),
                named(self.shards.clusters_of(shards)),
                limit,
                chosen,
                named(list(live)),
            )
        self.untaken = set(untaken)
