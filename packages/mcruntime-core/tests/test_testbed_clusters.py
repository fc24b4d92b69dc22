"""The testbed's clusters are real, separate Kubernetes API servers."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from kube_helpers import core_api, make_namespace, unique
from kubernetes_asyncio import client, watch
from kubernetes_asyncio.client.exceptions import ApiException

from mcruntime.testing import ControlPlane, Fleet


def _configmap(name: str, value: str) -> client.V1ConfigMap:
    return client.V1ConfigMap(metadata=client.V1ObjectMeta(name=name), data={"value": value})


async def test_configmap_create_get_list_in_every_cluster(fleet: Fleet) -> None:
    assert len(fleet) == 3
    for plane in fleet:
        async with core_api(plane.kubeconfig()) as api:
            namespace = await make_namespace(api)
            await api.create_namespaced_config_map(namespace, _configmap("greeting", plane.name))
            got = await api.read_namespaced_config_map("greeting", namespace)
            listed = await api.list_namespaced_config_map(namespace)
        assert got.data == {"value": plane.name}
        assert [item.metadata.name for item in listed.items] == ["greeting"]


async def test_an_object_in_one_cluster_is_invisible_in_the_others(fleet: Fleet) -> None:
    first, *others = list(fleet)
    name = unique("only-here")
    async with core_api(first.kubeconfig()) as api:
        await api.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
        assert (await api.read_namespace(name)).metadata.name == name
    for plane in others:
        async with core_api(plane.kubeconfig()) as api:
            with pytest.raises(ApiException) as raised:
                await api.read_namespace(name)
        assert raised.value.status == 404, plane.name


async def test_a_watch_sees_add_update_and_delete(fleet: Fleet) -> None:
    plane = fleet["cluster-2"]
    async with core_api(plane.kubeconfig()) as api:
        namespace = await make_namespace(api)
        listed = await api.list_namespaced_config_map(namespace)
        seen: list[tuple[str, str | None]] = []

        async def observe() -> None:
            async with watch.Watch() as stream:
                async for event in stream.stream(
                    api.list_namespaced_config_map,
                    namespace,
                    resource_version=listed.metadata.resource_version,
                ):
                    data = event["object"].data or {}
                    seen.append((event["type"], data.get("value")))
                    if event["type"] == "DELETED":
                        # Leaving mid-stream, aiohttp closes the connection politely: TLS waits
                        # for the server's goodbye, and a loop that ends first leaves the socket
                        # open for a later test's garbage collection to warn about. Drop it now.
                        response: Any = stream.resp  # typed as its initial None
                        response.connection.transport.abort()
                        return

        observer = asyncio.create_task(observe())
        await api.create_namespaced_config_map(namespace, _configmap("watched", "one"))
        await api.patch_namespaced_config_map("watched", namespace, {"data": {"value": "two"}})
        await api.delete_namespaced_config_map("watched", namespace)
        await asyncio.wait_for(observer, timeout=30)
    assert seen == [("ADDED", "one"), ("MODIFIED", "two"), ("DELETED", "two")]


async def test_a_restarted_apiserver_still_has_its_data(fresh_cluster: ControlPlane) -> None:
    plane = fresh_cluster
    async with core_api(plane.kubeconfig()) as api:
        namespace = await make_namespace(api)
        await api.create_namespaced_config_map(namespace, _configmap("kept", "before"))
    port = plane.apiserver.port
    await plane.stop_async()
    assert not plane.running
    await plane.start_async()
    assert plane.apiserver.port == port, "kubeconfigs handed out before the restart stay valid"
    async with core_api(plane.kubeconfig()) as api:
        got = await api.read_namespaced_config_map("kept", namespace)
    assert got.data == {"value": "before"}


async def test_a_second_apiserver_serves_the_same_storage_while_the_first_is_down(
    fresh_cluster: ControlPlane,
) -> None:
    plane = fresh_cluster
    async with core_api(plane.kubeconfig()) as api:
        namespace = await make_namespace(api)
    secondary = await asyncio.to_thread(plane.start_secondary)
    assert secondary.port != plane.apiserver.port
    await asyncio.to_thread(plane.apiserver.stop)
    async with core_api(secondary.kubeconfig()) as api:
        await api.create_namespaced_config_map(namespace, _configmap("written", "while-down"))
    await plane.apiserver.start_async()
    async with core_api(plane.kubeconfig()) as api:
        got = await api.read_namespaced_config_map("written", namespace)
    assert got.data == {"value": "while-down"}
