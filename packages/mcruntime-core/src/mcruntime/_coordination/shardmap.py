"""Which shard each engaged cluster falls in, kept up to date by difference.

Fences are per shard, work is per cluster: the round asks which shards have
engaged clusters (those are the shards worth a fence) and which clusters a
held shard covers. At 10,000 clusters and a round after every fence that
changes hands, hashing every name each round would be most of the round, so
only clusters that came or went since the last update are hashed.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping

from .shardhub import ShardingConfig


class ShardMap:
    """The engaged clusters grouped by shard, as of the last :meth:`update`."""

    def __init__(self, config: ShardingConfig) -> None:
        self.config = config
        self._shard: dict[str, int] = {}  # engaged cluster → its shard
        self._members: dict[int, set[str]] = {}  # shard → its engaged clusters (never empty)

    def update(self, clusters: Mapping[str, object]) -> None:
        """Follow the engaged clusters (the keys of ``clusters``)."""
        known = self._shard
        if len(known) == len(clusters) and known.keys() == clusters.keys():
            return
        for gone in known.keys() - clusters.keys():
            shard = known.pop(gone)
            members = self._members[shard]
            members.discard(gone)
            if not members:
                del self._members[shard]
        for came in clusters.keys() - known.keys():
            shard = known[came] = self.config.shard_of(came)
            self._members.setdefault(shard, set()).add(came)

    def __contains__(self, cluster: object) -> bool:
        """Whether ``cluster`` was engaged at the last update."""
        return cluster in self._shard

    @property
    def in_use(self) -> Mapping[int, set[str]]:
        """Shards with at least one engaged cluster (shard → its clusters; read only)."""
        return self._members

    def members(self, shard: int) -> frozenset[str]:
        """The engaged clusters of ``shard`` (empty when none is)."""
        return frozenset(self._members.get(shard, ()))

    def clusters_of(self, shards: Iterable[int]) -> set[str]:
        """The engaged clusters of all ``shards``."""
        found: set[str] = set()
        for shard in shards:
            found |= self._members.get(shard, set())
        return found

    def shard(self, cluster: str) -> int:
        """The shard of any cluster, engaged or not."""
        known = self._shard.get(cluster)
        return known if known is not None else self.config.shard_of(cluster)


def named(things: Collection[object], shown: int = 5) -> str:
    """A few names (clusters, shards) for a log line, and how many more: bounded however many there are."""
    ordered = sorted(things, key=lambda thing: (isinstance(thing, str), thing))
    listed = ", ".join(repr(thing) if isinstance(thing, str) else str(thing) for thing in ordered[:shown])
    rest = len(ordered) - shown
    return f"{listed} and {rest} more" if rest > 0 else listed or "none"
