"""The cluster cache: lazy informers, field indexes, selectors, and copies."""

from __future__ import annotations

import re

import pytest
from kube_helpers import CONFIGMAP, configmap, configmap_reader, new_namespace, running_cluster

import mcruntime as mcr
from mcruntime.cache import CacheSyncTimeout, field_getter
from mcruntime.testing import Fleet, wait_until


def _labelled(name: str, namespace: str, team: str, owner: str) -> dict[str, object]:
    manifest = configmap(name, namespace, owner=owner)
    manifest["metadata"]["labels"] = {"team": team}
    return manifest


async def test_the_first_read_starts_an_informer_and_later_reads_stay_local(fleet: Fleet) -> None:
    async with running_cluster(fleet["cluster-1"]) as cluster:
        namespace = await new_namespace(cluster)
        await cluster.client.create(configmap("a", namespace, v="1"))
        assert cluster.cache.informers() == []
        got = await cluster.cache.get_or_none(CONFIGMAP, "a", namespace=namespace)
        assert got is not None and got["data"] == {"v": "1"}
        assert len(cluster.cache.informers()) == 1
        assert await cluster.cache.get_or_none(CONFIGMAP, "missing", namespace=namespace) is None
        for _ in range(3):
            await cluster.cache.list(CONFIGMAP, namespace=namespace)
        assert len(cluster.cache.informers()) == 1
        assert cluster.cache.informers()[0].stats.lists == 1


async def test_cache_and_client_share_one_read_convention(fleet: Fleet) -> None:
    """``get`` raises NotFound naming cluster and object, ``get_or_none`` answers None: both readers."""
    async with running_cluster(fleet["cluster-1"], "reads") as cluster:
        namespace = await new_namespace(cluster)
        await cluster.client.create(configmap("here", namespace, v="1"))
        for reader in (cluster.cache, cluster.client):
            found = await reader.get(CONFIGMAP, "here", namespace=namespace)
            assert found["data"] == {"v": "1"}
            with pytest.raises(mcr.NotFound) as missing:
                await reader.get(CONFIGMAP, "absent", namespace=namespace)
            assert missing.value.cluster == "reads" and "absent" in str(missing.value)
            assert await reader.get_or_none(CONFIGMAP, "absent", namespace=namespace) is None
            assert (await reader.get_or_none(CONFIGMAP, "here", namespace=namespace) or {})["data"] == {
                "v": "1"
            }


async def test_field_indexes_registered_before_and_after_the_informer_starts(fleet: Fleet) -> None:
    async with running_cluster(fleet["cluster-2"]) as cluster:
        namespace = await new_namespace(cluster)
        await cluster.client.create(_labelled("x", namespace, "blue", "alice"))
        await cluster.client.create(_labelled("y", namespace, "green", "bob"))
        cluster.cache.index_field(CONFIGMAP, "owner", field_getter("data", "owner"))
        alice = await cluster.cache.list(CONFIGMAP, index=("owner", "alice"))
        assert [obj["metadata"]["name"] for obj in alice] == ["x"]
        cluster.cache.index_field(
            CONFIGMAP, "team", lambda obj: [obj["metadata"].get("labels", {}).get("team", "")]
        )
        green = await cluster.cache.list(CONFIGMAP, index=("team", "green"), namespace=namespace)
        assert [obj["metadata"]["name"] for obj in green] == ["y"]
        await cluster.client.patch(CONFIGMAP, "y", {"data": {"owner": "alice"}}, namespace=namespace)

        async def both_owned_by_alice() -> bool:
            owned = await cluster.cache.list(CONFIGMAP, index=("owner", "alice"), namespace=namespace)
            return sorted(obj["metadata"]["name"] for obj in owned) == ["x", "y"]

        await wait_until(both_owned_by_alice)


async def test_list_filters_by_namespace_and_label_selector(fleet: Fleet) -> None:
    async with running_cluster(fleet["cluster-2"]) as cluster:
        first, second = await new_namespace(cluster), await new_namespace(cluster)
        await cluster.client.create(_labelled("a", first, "blue", "x"))
        await cluster.client.create(_labelled("b", first, "green", "x"))
        await cluster.client.create(_labelled("c", second, "blue", "x"))

        async def blue_in_first() -> list[str]:
            found = await cluster.cache.list(CONFIGMAP, namespace=first, label_selector="team in (blue)")
            return [obj["metadata"]["name"] for obj in found]

        await wait_until(lambda: blue_in_first())
        assert await blue_in_first() == ["a"]
        everywhere = await cluster.cache.list(CONFIGMAP, label_selector={"team": "blue"})
        assert {(o["metadata"]["namespace"], o["metadata"]["name"]) for o in everywhere} >= {
            (first, "a"),
            (second, "c"),
        }


async def test_a_caller_mutating_what_it_read_cannot_corrupt_the_cache(fleet: Fleet) -> None:
    async with running_cluster(fleet["cluster-3"]) as cluster:
        namespace = await new_namespace(cluster)
        await cluster.client.create(configmap("shared", namespace, v="original"))
        first = await cluster.cache.get_or_none(CONFIGMAP, "shared", namespace=namespace)
        assert first is not None
        first["data"]["v"] = "mutated"
        first["metadata"]["labels"] = {"added": "by-caller"}
        listed = await cluster.cache.list(CONFIGMAP, namespace=namespace)
        listed[0]["data"].clear()
        again = await cluster.cache.get_or_none(CONFIGMAP, "shared", namespace=namespace)
        assert again is not None
        assert again["data"] == {"v": "original"}
        assert "labels" not in again["metadata"]


async def test_a_namespace_scoped_cache_needs_only_namespaced_rights(fleet: Fleet) -> None:
    plane = fleet["cluster-2"]
    async with running_cluster(plane, "admin") as admin:
        mine, other = await new_namespace(admin, "mine"), await new_namespace(admin, "other")
        await admin.client.create(configmap("here", mine, v="1"))
        await admin.client.create(configmap("there", other, v="1"))
        user = await configmap_reader(admin, plane, mine)
    config = mcr.kubeconfig_from_dict(plane.kubeconfig(user))
    scoped = mcr.ClusterOptions(cache_namespace=mine, cache_sync_timeout=10)
    async with mcr.Cluster("scoped", config, scoped) as cluster:
        found = await cluster.cache.list(CONFIGMAP)
        assert [(o["metadata"]["namespace"], o["metadata"]["name"]) for o in found] == [(mine, "here")]
        assert await cluster.cache.get_or_none(CONFIGMAP, "here", namespace=mine) is not None
        with pytest.raises(ValueError, match=re.escape(f"holds namespace '{mine}' only")):
            await cluster.cache.get_or_none(CONFIGMAP, "there", namespace=other)
    # The same user without the scope would need cluster-wide list rights.
    async with mcr.Cluster("wide", config, mcr.ClusterOptions(cache_sync_timeout=1)) as cluster:
        with pytest.raises(CacheSyncTimeout, match=r"(?i)forbidden"):
            await cluster.cache.list(CONFIGMAP)
