"""The cluster cache: lazy informers, field indexes, selectors, and copies."""

from __future__ import annotations

import re

import pytest
from kube_helpers import CONFIGMAP, configmap, new_namespace, running_cluster, wait_for

import mcruntime as mcr
from mcruntime.testing import Fleet


def _labelled(name: str, namespace: str, team: str, owner: str) -> dict[str, object]:
    manifest = configmap(name, namespace, owner=owner)
    manifest["metadata"]["labels"] = {"team": team}
    return manifest


async def test_the_first_read_starts_an_informer_and_later_reads_stay_local(fleet: Fleet) -> None:
    async with running_cluster(fleet["cluster-1"]) as cluster:
        namespace = await new_namespace(cluster)
        await cluster.client.create(configmap("a", namespace, v="1"))
        assert cluster.cache.informers() == []
        got = await cluster.reader.get(CONFIGMAP, "a", namespace=namespace)
        assert got is not None and got["data"] == {"v": "1"}
        assert len(cluster.cache.informers()) == 1
        assert await cluster.reader.get(CONFIGMAP, "missing", namespace=namespace) is None
        for _ in range(3):
            await cluster.reader.list(CONFIGMAP, namespace=namespace)
        assert len(cluster.cache.informers()) == 1
        assert cluster.cache.informers()[0].stats.lists == 1


async def test_field_indexes_registered_before_and_after_the_informer_starts(fleet: Fleet) -> None:
    async with running_cluster(fleet["cluster-2"]) as cluster:
        namespace = await new_namespace(cluster)
        await cluster.client.create(_labelled("x", namespace, "blue", "alice"))
        await cluster.client.create(_labelled("y", namespace, "green", "bob"))
        cluster.cache.index_field(CONFIGMAP, "owner", mcr.field_getter("data", "owner"))
        alice = await cluster.reader.list(CONFIGMAP, index=("owner", "alice"))
        assert [obj["metadata"]["name"] for obj in alice] == ["x"]
        cluster.cache.index_field(
            CONFIGMAP, "team", lambda obj: [obj["metadata"].get("labels", {}).get("team", "")]
        )
        green = await cluster.reader.list(CONFIGMAP, index=("team", "green"), namespace=namespace)
        assert [obj["metadata"]["name"] for obj in green] == ["y"]
        await cluster.client.patch(CONFIGMAP, "y", {"data": {"owner": "alice"}}, namespace=namespace)

        async def both_owned_by_alice() -> bool:
            owned = await cluster.reader.list(CONFIGMAP, index=("owner", "alice"), namespace=namespace)
            return sorted(obj["metadata"]["name"] for obj in owned) == ["x", "y"]

        await wait_for(both_owned_by_alice)


async def test_list_filters_by_namespace_and_label_selector(fleet: Fleet) -> None:
    async with running_cluster(fleet["cluster-2"]) as cluster:
        first, second = await new_namespace(cluster), await new_namespace(cluster)
        await cluster.client.create(_labelled("a", first, "blue", "x"))
        await cluster.client.create(_labelled("b", first, "green", "x"))
        await cluster.client.create(_labelled("c", second, "blue", "x"))

        async def blue_in_first() -> list[str]:
            found = await cluster.reader.list(CONFIGMAP, namespace=first, label_selector="team in (blue)")
            return [obj["metadata"]["name"] for obj in found]

        await wait_for(lambda: blue_in_first())
        assert await blue_in_first() == ["a"]
        everywhere = await cluster.reader.list(CONFIGMAP, label_selector={"team": "blue"})
        assert {(o["metadata"]["namespace"], o["metadata"]["name"]) for o in everywhere} >= {
            (first, "a"),
            (second, "c"),
        }


async def test_a_caller_mutating_what_it_read_cannot_corrupt_the_cache(fleet: Fleet) -> None:
    async with running_cluster(fleet["cluster-3"]) as cluster:
        namespace = await new_namespace(cluster)
        await cluster.client.create(configmap("shared", namespace, v="original"))
        first = await cluster.reader.get(CONFIGMAP, "shared", namespace=namespace)
        assert first is not None
        first["data"]["v"] = "mutated"
        first["metadata"]["labels"] = {"added": "by-caller"}
        listed = await cluster.reader.list(CONFIGMAP, namespace=namespace)
        listed[0]["data"].clear()
        again = await cluster.reader.get(CONFIGMAP, "shared", namespace=namespace)
        assert again is not None
        assert again["data"] == {"v": "original"}
        assert "labels" not in again["metadata"]


async def test_a_namespace_scoped_cache_needs_only_namespaced_rights(fleet: Fleet) -> None:
    plane = fleet["cluster-2"]
    async with running_cluster(plane, "admin") as admin:
        mine, other = await new_namespace(admin, "mine"), await new_namespace(admin, "other")
        await admin.client.create(configmap("here", mine, v="1"))
        await admin.client.create(configmap("there", other, v="1"))
        await admin.client.create(
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "Role",
                "metadata": {"name": "read-configmaps", "namespace": mine},
                "rules": [
                    {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list", "watch"]}
                ],
            }
        )
        user = plane.add_token_user("reader", cluster_admin=False, namespace=mine)
        await admin.client.create(
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "RoleBinding",
                "metadata": {"name": "reader", "namespace": mine},
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "Role",
                    "name": "read-configmaps",
                },
                "subjects": [{"kind": "ServiceAccount", "name": "reader", "namespace": mine}],
            }
        )
    config = mcr.kubeconfig_from_dict(plane.kubeconfig(user))
    scoped = mcr.ClusterOptions(cache_namespace=mine, cache_sync_timeout=10)
    async with mcr.Cluster("scoped", config, scoped) as cluster:
        found = await cluster.reader.list(CONFIGMAP)
        assert [(o["metadata"]["namespace"], o["metadata"]["name"]) for o in found] == [(mine, "here")]
        assert await cluster.reader.get(CONFIGMAP, "here", namespace=mine) is not None
        with pytest.raises(ValueError, match=re.escape(f"holds namespace '{mine}' only")):
            await cluster.reader.get(CONFIGMAP, "there", namespace=other)
    # The same user without the scope would need cluster-wide list rights.
    async with mcr.Cluster("wide", config, mcr.ClusterOptions(cache_sync_timeout=1)) as cluster:
        with pytest.raises(mcr.CacheSyncTimeout, match=r"(?i)forbidden"):
            await cluster.reader.list(CONFIGMAP)
