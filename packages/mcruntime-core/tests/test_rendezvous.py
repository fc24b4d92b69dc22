"""Weighted rendezvous hashing: shares follow weights, and only what must move moves."""

from __future__ import annotations

from collections import Counter

import pytest

from mcruntime._coordination.rendezvous import Shares, assign, owner, score, uniform

CLUSTERS = [f"cluster-{index}" for index in range(1000)]


def shares(peers: dict[str, float]) -> Counter[str]:
    return Counter(assign(CLUSTERS, peers).values())


def test_weights_one_one_two_split_near_25_25_50() -> None:
    counted = shares({"replica-0": 1, "replica-1": 1, "replica-2": 2})
    # One standard deviation is about 14 clusters for p = 0.25 and 16 for p = 0.5.
    assert abs(counted["replica-0"] - 250) <= 45, counted
    assert abs(counted["replica-1"] - 250) <= 45, counted
    assert abs(counted["replica-2"] - 500) <= 50, counted


def test_sequential_peer_names_split_evenly() -> None:
    # The skew multicluster-runtime's FNV scoring shows for names like these.
    counted = shares({f"peer-{index}": 1 for index in range(4)})
    assert all(abs(count - 250) <= 45 for count in counted.values()), counted


def test_a_lost_peer_moves_only_its_own_clusters() -> None:
    before = assign(CLUSTERS, {"a": 1, "b": 1, "c": 1})
    after = assign(CLUSTERS, {"a": 1, "b": 1})
    moved = {cluster for cluster in CLUSTERS if before[cluster] != after[cluster]}
    assert moved == {cluster for cluster, peer in before.items() if peer == "c"}


def test_a_new_peer_takes_its_share_from_everyone_and_nothing_else_moves() -> None:
    before = assign(CLUSTERS, {"a": 1, "b": 1, "c": 1})
    after = assign(CLUSTERS, {"a": 1, "b": 1, "c": 1, "d": 1})
    moved = {cluster for cluster in CLUSTERS if before[cluster] != after[cluster]}
    assert all(after[cluster] == "d" for cluster in moved)
    assert abs(len(moved) - 250) <= 45
    assert {before[cluster] for cluster in moved} == {"a", "b", "c"}


def test_scores_are_deterministic_and_well_formed() -> None:
    assert uniform("x", "p") == uniform("x", "p")
    assert 0.0 < uniform("x", "p") < 1.0
    assert score("x", "p", 2.0) == pytest.approx(score("x", "p", 1.0) / 2)
    assert owner("x", {}) is None
    with pytest.raises(ValueError, match="weight must be positive"):
        score("x", "p", 0)


def test_shares_hash_only_what_changed_and_agree_with_assign() -> None:
    # The sharding round asks after every fence that changes hands: a round in which
    # nothing changed must hash nothing, whatever the fleet's size.
    shares: Shares[str] = Shares("b")
    peers = {"a": 1.0, "b": 1.0, "c": 2.0}
    clusters = dict.fromkeys(CLUSTERS)

    def expected() -> set[str]:
        return {cluster for cluster, peer in assign(clusters, peers).items() if peer == "b"}

    assert shares.mine(clusters, peers) == expected()
    assert shares.computed == len(CLUSTERS)
    assert shares.mine(clusters, dict(peers)) == expected()
    assert shares.computed == len(CLUSTERS)  # nothing changed: nothing hashed

    clusters["late"] = None
    del clusters["cluster-0"]
    assert shares.mine(clusters, peers) == expected()
    assert shares.computed == len(CLUSTERS) + 1  # only the newcomer

    peers = {"a": 1.0, "b": 1.0}  # a peer left: every owner is computed again
    assert shares.mine(clusters, peers) == expected()
    assert shares.computed == 2 * len(CLUSTERS) + 1
    peers = {"a": 1.0, "b": 3.0}  # a weight changed: so is every owner
    assert shares.mine(clusters, peers) == expected()
    assert shares.computed == 3 * len(CLUSTERS) + 1

    mine = shares.mine(clusters, peers)
    mine.clear()  # a fresh set each time: the caller may keep or change it
    assert shares.mine(clusters, peers) == expected()
