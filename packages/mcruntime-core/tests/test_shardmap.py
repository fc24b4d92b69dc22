"""Shards of the fleet: every cluster in one shard, the same on every replica, followed by difference."""

from __future__ import annotations

from collections import Counter

import pytest

import mcruntime as mcr
from mcruntime._coordination.shardmap import ShardMap

CLUSTERS = [f"cluster-{index}" for index in range(10_000)]


def test_clusters_spread_evenly_over_the_shards() -> None:
    config = mcr.ShardingConfig(shards=256)
    counted = Counter(config.shard_of(name) for name in CLUSTERS)
    assert set(counted) == set(range(256))
    # About 39 clusters a shard; one standard deviation is about 6.
    assert max(counted.values()) <= 39 + 30 and min(counted.values()) >= 39 - 30, counted


def test_a_shard_fence_names_the_count_so_two_counts_never_share_one() -> None:
    ours, theirs = mcr.ShardingConfig(name="ctl", shards=256), mcr.ShardingConfig(name="ctl", shards=128)
    assert ours.fence_lease("x") == f"ctl-fence-256-{ours.shard_of('x')}"
    assert ours.shard_fence(7) != theirs.shard_fence(7)
    # Every cluster of one shard shares its fence.
    partner = next(name for name in CLUSTERS if ours.shard_of(name) == ours.shard_of("x"))
    assert ours.fence_lease(partner) == ours.fence_lease("x")


@pytest.mark.parametrize("shards", [0, -1, 4097, 1.5, True, "256"])
def test_a_shard_count_out_of_range_is_refused_naming_it(shards: object) -> None:
    with pytest.raises(ValueError, match=f"shards must be a whole number from 1 to 4096, not {shards!r}"):
        mcr.ShardingConfig(shards=shards)  # type: ignore[arg-type]


def test_the_map_follows_clusters_that_come_and_go() -> None:
    config = mcr.ShardingConfig(shards=4)
    shards = ShardMap(config)
    shards.update(dict.fromkeys(CLUSTERS[:100]))
    assert sum(len(members) for members in shards.in_use.values()) == 100
    assert all(config.shard_of(name) == shard for shard, names in shards.in_use.items() for name in names)
    first = config.shard_of(CLUSTERS[0])
    assert CLUSTERS[0] in shards and CLUSTERS[0] in shards.members(first)
    # Clusters leave: empty shards are no longer in use, the others keep their members.
    alone = {name for name in CLUSTERS[:100] if config.shard_of(name) != first}
    shards.update(dict.fromkeys(alone))
    assert first not in shards.in_use and shards.members(first) == frozenset()
    assert CLUSTERS[0] not in shards and shards.shard(CLUSTERS[0]) == first
    assert shards.clusters_of(shards.in_use) == alone
    shards.update({})
    assert not shards.in_use


def test_the_work_of_many_shards_is_found_in_one_pass_as_each_alone() -> None:
    from types import SimpleNamespace
    from typing import Any

    from mcruntime._coordination.coordinator import WorkGate
    from mcruntime._coordination.fences import Fences

    config = mcr.ShardingConfig(shards=8)
    shards = ShardMap(config)
    engaged = CLUSTERS[:150]
    shards.update(dict.fromkeys(engaged))
    gate = WorkGate(list)
    # Open: part of the engaged, and some that left the fleet with their work still closing.
    gate.open(*CLUSTERS[100:200])
    none: Any = None
    fences = Fences(config, none, none, shards, wake=lambda: None, renewed=lambda: None, spawn=none)
    fences.seat = SimpleNamespace(work=gate)
    expected = {
        shard: {name for name in CLUSTERS[:200] if config.shard_of(name) == shard} for shard in range(8)
    }
    assert fences.working_in(range(8)) == {shard: found for shard, found in expected.items() if found}
    assert fences.working_in([3, 5]) == {3: expected[3], 5: expected[5]}
    for shard in range(8):
        assert fences.working(shard) == expected[shard]
