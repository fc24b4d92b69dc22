"""NamespacedCluster: a namespace of a host as a cluster, pinned, on the host's connection and informers."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from kube_helpers import CONFIGMAP, NAMESPACE, configmap, new_namespace, running_cluster

import mcruntime as mcr
from mcruntime.cache import field_getter
from mcruntime.testing import Fleet, wait_until


async def test_the_client_pins_namespaced_kinds_and_refuses_other_namespaces(fleet: Fleet) -> None:
    async with running_cluster(fleet["cluster-1"], "host") as host:
        mine, other = await new_namespace(host, "mine"), await new_namespace(host, "other")
        await host.client.create(configmap("theirs", other))
        async with mcr.NamespacedCluster(host, mine) as tenant:
            assert tenant.name == mine and tenant.transport is host.transport
            # No namespace given: the object lands in the tenant's namespace, and reads find it there.
            await tenant.client.create({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "a"}})
            assert (await host.client.get(CONFIGMAP, "a", namespace=mine))["metadata"]["namespace"] == mine
            assert (await tenant.client.get(CONFIGMAP, "a"))["metadata"]["namespace"] == mine
            applied = await tenant.client.apply(
                {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "b"}, "data": {"k": "v"}},
                field_manager="test",
            )
            assert applied["metadata"]["namespace"] == mine
            listed = await tenant.client.list(CONFIGMAP)
            assert {item["metadata"]["namespace"] for item in listed.items} == {mine}
            # Another namespace, by argument or in the object, is refused before anything is sent.
            with pytest.raises(mcr.Forbidden) as refused:
                await tenant.client.get(CONFIGMAP, "theirs", namespace=other)
            assert refused.value.cluster == mine and refused.value.namespace == other
            assert repr(mine) in str(refused.value) and repr(other) in str(refused.value)
            with pytest.raises(mcr.Forbidden):
                await tenant.client.create(configmap("intruder", other))
            with pytest.raises(mcr.Forbidden):
                await tenant.client.delete(CONFIGMAP, "theirs", namespace=other)
            with pytest.raises(mcr.Forbidden):
                await tenant.client.list(CONFIGMAP, namespace=other)
            assert await host.client.get_or_none(CONFIGMAP, "intruder", namespace=other) is None
            with pytest.raises(mcr.Forbidden):
                await anext(aiter(tenant.client.watch(CONFIGMAP, namespace=other)))
            with pytest.raises(mcr.Forbidden):
                await tenant.cache.get_or_none(CONFIGMAP, "theirs", namespace=other)
            # Cluster-scoped kinds: shared, so readable, never written.
            assert (await tenant.client.get(NAMESPACE, mine))["metadata"]["name"] == mine
            with pytest.raises(mcr.Forbidden, match="cluster-scoped"):
                await tenant.client.create(
                    {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "x"}}
                )
            with pytest.raises(mcr.Forbidden, match="cluster-scoped"):
                await tenant.client.delete(NAMESPACE, other)


def recorder(seen: list[tuple[str, str]]) -> Callable[[dict[str, Any], bool], None]:
    def on_add(obj: dict[str, Any], _initial: bool) -> None:
        seen.append((obj["metadata"]["namespace"], obj["metadata"]["name"]))

    return on_add


async def test_views_share_one_informer_per_kind_and_see_only_their_namespace(fleet: Fleet) -> None:
    async with running_cluster(fleet["cluster-2"], "host") as host:
        namespaces = [await new_namespace(host, "tenant") for _ in range(4)]
        for namespace in namespaces:
            await host.client.create(configmap("cm", namespace, owner=namespace))
        tenants = [mcr.NamespacedCluster(host, namespace) for namespace in namespaces]
        events: dict[str, list[tuple[str, str]]] = {namespace: [] for namespace in namespaces}
        for tenant in tenants:
            await tenant.start()
            tenant.cache.informer(CONFIGMAP).add_handler(
                mcr.ResourceEventHandler(on_add=recorder(events[tenant.namespace]))
            )
        for tenant in tenants:
            found = await tenant.cache.list(CONFIGMAP)
            assert {obj["metadata"]["namespace"] for obj in found} <= {tenant.namespace}
            assert [obj["data"]["owner"] for obj in found if obj["metadata"]["name"] == "cm"] == [
                tenant.namespace
            ]
            assert (await tenant.cache.get(CONFIGMAP, "cm"))["data"]["owner"] == tenant.namespace
            with pytest.raises(mcr.Forbidden):
                await tenant.cache.list(
                    CONFIGMAP, namespace=namespaces[0] if tenant is not tenants[0] else namespaces[1]
                )
        # Exactly one ConfigMap informer on the host, listed once, for all four tenants.
        shared = [informer for informer in host.cache.informers() if informer.kind == CONFIGMAP]
        assert len(shared) == 1 and shared[0].stats.lists == 1
        assert all(tenant.cache.informers()[0].stats is shared[0].stats for tenant in tenants)
        # A live event reaches only its namespace's handlers.
        await host.client.create(configmap("late", namespaces[2]))
        # (The testbed may add kube-root-ca.crt to each namespace meanwhile: count only the test's own.)
        await wait_until(lambda: (namespaces[2], "late") in events[namespaces[2]])
        assert all({ns for ns, _name in seen} == {namespace} for namespace, seen in events.items())
        own = [
            sorted(name for _ns, name in events[namespace] if name in ("cm", "late"))
            for namespace in namespaces
        ]
        assert own == [["cm"], ["cm"], ["cm", "late"], ["cm"]]
        # Indexes registered through one view live on the host and serve every view.
        tenants[0].cache.index_field(CONFIGMAP, "owner", field_getter("data", "owner"))
        assert [
            obj["metadata"]["namespace"]
            for obj in await tenants[3].cache.list(CONFIGMAP, index=("owner", namespaces[3]))
        ] == [namespaces[3]]
        assert await tenants[3].cache.list(CONFIGMAP, index=("owner", namespaces[0])) == []
        # Stopping a view ends its handlers' registrations' owner, not the host.
        await tenants[0].stop()
        assert tenants[0].stopped and len(tenants[0].tasks) == 0 and not host.stopped
        # Stopping the host stops every remaining view first.
        stopped: list[str] = []
        tenants[1].on_stop(lambda: stopped.append("tenant"))
        await host.stop()
        assert stopped == ["tenant"] and all(tenant.stopped for tenant in tenants)


async def test_a_view_needs_a_running_host(fleet: Fleet) -> None:
    config = mcr.kubeconfig_from_dict(fleet["cluster-3"].kubeconfig(), trust=mcr.TrustPolicy.untrusted())
    host = mcr.Cluster("host", config)
    with pytest.raises(RuntimeError, match="not running"):
        await mcr.NamespacedCluster(host, "default").start()
    with pytest.raises(ValueError, match="needs a namespace"):
        mcr.NamespacedCluster(host, "")
    scoped = mcr.Cluster("scoped", config, mcr.ClusterOptions(cache_namespace="team-a"))
    with pytest.raises(ValueError, match="caches namespace 'team-a' only"):
        mcr.NamespacedCluster(scoped, "team-b")
