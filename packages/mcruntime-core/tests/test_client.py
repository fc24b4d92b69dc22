"""The client against a real API server: every verb, typed errors, discovery refresh."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from kube_helpers import CONFIGMAP, configmap, install_widget_crd, new_namespace, running_cluster, unique
from kubernetes_asyncio import client as k8s

import mcruntime as mcr
from mcruntime.testing import ControlPlane, Fleet, wait_until

DEPLOYMENT = mcr.Kind("apps/v1", "Deployment")


def _deployment(name: str, namespace: str) -> dict[str, object]:
    labels = {"app": name}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {"containers": [{"name": "main", "image": "example.invalid/app:1"}]},
            },
        },
    }


async def test_create_get_update_delete_a_configmap(fleet: Fleet) -> None:
    async with running_cluster(fleet["cluster-1"]) as cluster:
        c = cluster.client
        namespace = await new_namespace(cluster)
        created = await c.create(configmap("cm", namespace, a="1"))
        assert created["metadata"]["uid"]
        got = await c.get(CONFIGMAP, "cm", namespace=namespace)
        assert got["data"] == {"a": "1"}
        got["data"]["a"] = "2"
        updated = await c.update(got)
        assert updated["data"] == {"a": "2"}
        with pytest.raises(mcr.Conflict) as stale:
            await c.update(got)  # got still carries the old resourceVersion
        assert stale.value.status == 409
        assert (stale.value.kind, stale.value.namespace, stale.value.name) == ("ConfigMap", namespace, "cm")
        await c.delete(CONFIGMAP, "cm", namespace=namespace)
        with pytest.raises(mcr.NotFound) as missing:
            await c.get(CONFIGMAP, "cm", namespace=namespace)
        assert missing.value.cluster == "cluster-1"
        assert f"{namespace}/cm" in str(missing.value)


async def test_creating_an_existing_name_is_already_exists(fleet: Fleet) -> None:
    async with running_cluster(fleet["cluster-1"]) as cluster:
        namespace = await new_namespace(cluster)
        await cluster.client.create(configmap("twice", namespace))
        with pytest.raises(mcr.AlreadyExists):
            await cluster.client.create(configmap("twice", namespace))


async def test_writes_accept_kubernetes_asyncio_models(fleet: Fleet) -> None:
    async with running_cluster(fleet["cluster-1"]) as cluster:
        namespace = await new_namespace(cluster)
        model = k8s.V1ConfigMap(
            api_version="v1",
            kind="ConfigMap",
            metadata=k8s.V1ObjectMeta(name="from-model", namespace=namespace, labels={"x": "y"}),
            data={"k": "v"},
        )
        created = await cluster.client.create(model)
        assert created["metadata"]["labels"] == {"x": "y"}
        assert created["data"] == {"k": "v"}


async def test_every_patch_type_on_a_built_in_kind(fleet: Fleet) -> None:
    async with running_cluster(fleet["cluster-1"]) as cluster:
        c = cluster.client
        namespace = await new_namespace(cluster)
        await c.create(configmap("p", namespace, a="1"))
        merged = await c.patch(CONFIGMAP, "p", {"data": {"b": "2"}}, namespace=namespace)
        assert merged["data"] == {"a": "1", "b": "2"}
        jsonpatched = await c.patch(
            CONFIGMAP, "p", [{"op": "remove", "path": "/data/a"}], namespace=namespace, patch_type="json"
        )
        assert jsonpatched["data"] == {"b": "2"}
        await c.create(_deployment("web", namespace))
        strategic = await c.patch(
            DEPLOYMENT,
            "web",
            {
                "spec": {
                    "template": {"spec": {"containers": [{"name": "side", "image": "example.invalid/s:1"}]}}
                }
            },
            namespace=namespace,
            patch_type="strategic",
        )
        names = [container["name"] for container in strategic["spec"]["template"]["spec"]["containers"]]
        assert names == ["side", "main"]  # strategic merge merges lists by key; merge patch would replace


async def test_server_side_apply_is_idempotent_and_reports_conflicts(fleet: Fleet) -> None:
    async with running_cluster(fleet["cluster-2"]) as cluster:
        c = cluster.client
        namespace = await new_namespace(cluster)
        manifest = configmap("applied", namespace, owner="first")
        first = await c.apply(manifest, field_manager="first")
        again = await c.apply(manifest, field_manager="first")
        assert again["metadata"]["resourceVersion"] == first["metadata"]["resourceVersion"]
        with pytest.raises(mcr.Conflict) as conflict:
            await c.apply(configmap("applied", namespace, owner="second"), field_manager="second")
        assert conflict.value.details.get("causes")
        forced = await c.apply(
            configmap("applied", namespace, owner="second"), field_manager="second", force=True
        )
        assert forced["data"] == {"owner": "second"}


async def test_a_crd_created_after_start_is_found_and_its_status_updated(fleet: Fleet) -> None:
    async with running_cluster(fleet["cluster-2"]) as cluster:
        c = cluster.client
        await c.resource(CONFIGMAP)  # discovery loaded before the CRD exists
        widget = await install_widget_crd(cluster)
        namespace = await new_namespace(cluster)
        created = await c.create(
            {
                "apiVersion": widget.api_version,
                "kind": "Widget",
                "metadata": {"name": "w", "namespace": namespace},
                "spec": {"size": 1},
            }
        )
        created["status"] = {"phase": "Ready"}
        created["spec"] = {"size": 99}  # ignored by the status subresource
        updated = await c.update_status(created)
        assert updated["status"] == {"phase": "Ready"}
        assert updated["spec"] == {"size": 1}
        patched = await c.patch(widget, "w", {"spec": {"size": 2}}, namespace=namespace)
        assert patched["spec"] == {"size": 2}
        with pytest.raises(mcr.APIError) as unsupported:
            await c.patch(widget, "w", {"spec": {"size": 3}}, namespace=namespace, patch_type="strategic")
        assert unsupported.value.status == 415


async def test_an_unknown_kind_is_kind_not_found_without_hammering_discovery(fleet: Fleet) -> None:
    async with running_cluster(fleet["cluster-2"]) as cluster:
        missing = mcr.Kind("nothing.example/v1", "Nothing")
        with pytest.raises(mcr.KindNotFound):
            await cluster.client.get(missing, "x", namespace="default")
        refreshes = cluster.client.discovery.refreshes
        for _ in range(20):
            with pytest.raises(mcr.KindNotFound):
                await cluster.client.get(missing, "x", namespace="default")
        assert cluster.client.discovery.refreshes - refreshes <= 3  # a small burst, then rate-limited


async def test_delete_with_preconditions_and_propagation(fleet: Fleet) -> None:
    async with running_cluster(fleet["cluster-3"]) as cluster:
        c = cluster.client
        namespace = await new_namespace(cluster)
        created = await c.create(configmap("guarded", namespace))
        with pytest.raises(mcr.Conflict):
            await c.delete(CONFIGMAP, "guarded", namespace=namespace, uid="not-the-uid")
        deleting = await c.delete(
            CONFIGMAP,
            "guarded",
            namespace=namespace,
            uid=created["metadata"]["uid"],
            propagation_policy="Foreground",
        )
        # Foreground deletion waits on the garbage collector (not running in the
        # testbed), so the object stays, marked, until its finalizer goes.
        assert deleting is not None
        assert deleting["metadata"]["deletionTimestamp"]
        assert deleting["metadata"]["finalizers"] == ["foregroundDeletion"]
        await c.patch(CONFIGMAP, "guarded", {"metadata": {"finalizers": None}}, namespace=namespace)
        with pytest.raises(mcr.NotFound):
            await c.get(CONFIGMAP, "guarded", namespace=namespace)


async def test_list_follows_continue_tokens_across_1200_objects(fleet: Fleet) -> None:
    async with running_cluster(fleet["cluster-3"]) as cluster:
        c = cluster.client
        namespace = await new_namespace(cluster)
        semaphore = asyncio.Semaphore(32)

        async def make(index: int) -> None:
            async with semaphore:
                await c.create(configmap(f"cm-{index:04d}", namespace, index=str(index)))

        await asyncio.gather(*(make(i) for i in range(1200)))
        pages = [page async for page in c.list_pages(CONFIGMAP, namespace=namespace, page_size=100)]
        assert [len(page.items) for page in pages] == [100] * 12
        names = [item["metadata"]["name"] for page in pages for item in page.items]
        assert sorted(names) == [f"cm-{i:04d}" for i in range(1200)]
        full = await c.list(CONFIGMAP, namespace=namespace, page_size=100)
        assert len(full.items) == 1200
        assert full.resource_version
        assert all(item["kind"] == "ConfigMap" and item["apiVersion"] == "v1" for item in full.items)
        selected = await c.list(CONFIGMAP, namespace=namespace, label_selector={"missing": "label"})
        assert selected.items == []


async def test_bad_credentials_are_unauthorized(fleet: Fleet) -> None:
    plane = fleet["cluster-1"]
    kubeconfig = plane.kubeconfig(plane.token_user)
    kubeconfig["users"][0]["user"]["token"] = "wrong"
    async with mcr.Cluster("bad", mcr.kubeconfig_from_dict(kubeconfig)) as cluster:
        with pytest.raises(mcr.Unauthorized) as raised:
            await cluster.client.list(CONFIGMAP, namespace="default")
    assert raised.value.cluster == "bad"
    assert "wrong" not in str(raised.value)


async def test_a_stopped_server_is_unreachable_and_health_says_so(fresh_cluster: ControlPlane) -> None:
    options = mcr.ClusterOptions(retry=mcr.RetryPolicy(attempts=2, base_delay=0.01))
    async with running_cluster(fresh_cluster, options=options) as cluster:
        await cluster.client.list(CONFIGMAP, namespace="default")
        healthy = cluster.health
        assert healthy.healthy
        await fresh_cluster.stop_async()
        with pytest.raises(mcr.Unreachable) as raised:
            await cluster.client.list(CONFIGMAP, namespace="default")
        assert raised.value.cluster == fresh_cluster.name
        # The failed request woke the probe; its verdict follows (it was not there before the
        # request returned when every attempt's refusal came at once).
        await wait_until(lambda: not cluster.health.healthy, what="the probe's verdict", timeout=10)
        unhealthy = cluster.health
        assert unhealthy.last_error is not None
        assert "connect" in unhealthy.last_error


async def test_a_rotated_token_file_is_picked_up(fleet: Fleet, tmp_path: Path) -> None:
    plane = fleet["cluster-3"]
    before, after = plane.add_token_user(unique("before")), plane.add_token_user(unique("after"))
    token_file = tmp_path / "token"
    token_file.write_text(before.token or "")
    kubeconfig = plane.kubeconfig(before)
    kubeconfig["users"][0]["user"] = {"tokenFile": "token"}  # relative to base_dir
    config = mcr.kubeconfig_from_dict(kubeconfig, base_dir=tmp_path)
    async with mcr.Cluster("rotating", config) as cluster:
        await cluster.client.list(CONFIGMAP, namespace="default")
        assert await cluster.transport.authorization() == f"Bearer {before.token}"
        replacement = tmp_path / "token.new"
        replacement.write_text(after.token or "")
        replacement.replace(token_file)  # atomic, as a kubelet rotates a projected token
        await cluster.client.list(CONFIGMAP, namespace="default")
        assert await cluster.transport.authorization() == f"Bearer {after.token}"
