"""Weighted rendezvous hashing: which peer owns a cluster.

Each (cluster, peer) pair gets a score ``-ln(u) / weight`` with ``u`` uniform
in (0, 1) from blake2b of the pair; the lowest score owns the cluster. The
score is an exponential variable with rate ``weight``, and the minimum of
independent exponentials falls on peer ``i`` with probability
``weight_i / sum(weights)``: shares follow weights exactly in expectation.
Scores depend only on the pair, so when a peer leaves only its clusters move,
and a new peer takes only the clusters it now scores lowest on, from everyone
in proportion. (An FNV score of concatenated names, as in multicluster-runtime's
sharded coordinator, is poorly mixed for similar names and skews shares.)
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Hashable, Iterable, Mapping
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)

_SCALE = 2.0**64


def uniform(cluster: str, peer: str) -> float:
    """A well-mixed value in (0, 1) for the pair, identical on every replica."""
    digest = hashlib.blake2b(f"{cluster}\x00{peer}".encode(), digest_size=8).digest()
    return (int.from_bytes(digest, "big") + 0.5) / _SCALE


def score(cluster: str, peer: str, weight: float = 1.0) -> float:
    """Lower wins; a weight-2 peer wins twice as often as a weight-1 peer."""
    if weight <= 0:
        raise ValueError(f"peer {peer!r}: weight must be positive, not {weight}")
    return -math.log(uniform(cluster, peer)) / weight


def owner(cluster: str, peers: Mapping[str, float]) -> str | None:
    """The peer (identity → weight) that owns ``cluster``; ``None`` without peers.

    Ties, vanishingly rare, go to the smaller identity so every replica agrees.
    """
    best: tuple[float, str] | None = None
    for peer, weight in peers.items():
        candidate = (score(cluster, peer, weight), peer)
        if best is None or candidate < best:
            best = candidate
    return None if best is None else best[1]


def assign(clusters: Iterable[str], peers: Mapping[str, float]) -> dict[str, str]:
    """Every cluster's owner (clusters are left out when there are no peers)."""
    result: dict[str, str] = {}
    for cluster in clusters:
        chosen = owner(cluster, peers)
        if chosen is not None:
            result[cluster] = chosen
    return result


class Shares(Generic[K]):
    """One replica's shards (or clusters) under the current peers, hashing only what changed.

    The sharding round asks after every fence that changes hands, which at a
    cold start of 10,000 clusters is thousands of times a second across the
    group; hashing every (cluster, peer) pair each time made the rounds most
    of a replica's work. Owners are kept per cluster and computed again only
    for clusters that appeared, or for all when the peers (or their weights)
    change. Keys are hashed by their ``str()``.
    """

    def __init__(self, identity: str) -> None:
        self.identity = identity
        self._peers: dict[str, float] = {}
        self._owners: dict[K, str | None] = {}
        self._mine: set[K] = set()
        self.computed: int = 0
        """Owners computed so far (what the cache saves is visible in tests)."""

    def mine(self, clusters: Mapping[K, object], peers: Mapping[str, float]) -> set[K]:
        """The keys of ``clusters`` that ``peers`` give this replica; a fresh set."""
        if peers != self._peers:
            self._peers = dict(peers)
            self._owners.clear()
            self._mine.clear()
        for gone in self._owners.keys() - clusters.keys():
            del self._owners[gone]
            self._mine.discard(gone)
        for name in clusters.keys() - self._owners.keys():
            chosen = self._owners[name] = owner(str(name), self._peers)
            self.computed += 1
            if chosen == self.identity:
                self._mine.add(name)
        return set(self._mine)
