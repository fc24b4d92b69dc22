"""A Cluster's lifetime: stopping it releases every task and socket it owned."""

from __future__ import annotations

import asyncio
import os

import pytest
from kube_helpers import CONFIGMAP, NAMESPACE, configmap, install_widget_crd, new_namespace, running_cluster

import mcruntime as mcr
from mcruntime.testing import Fleet, wait_until


def _sockets() -> set[str]:
    """Inodes of this process's open sockets."""
    found = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:"):
            found.add(target)
    return found


async def test_stop_leaves_no_task_no_socket_and_no_private_file(fleet: Fleet) -> None:
    tasks_before = asyncio.all_tasks()
    sockets_before = _sockets()
    plane = fleet["cluster-1"]
    cluster = mcr.Cluster("lifetime", mcr.kubeconfig_from_dict(plane.kubeconfig()))
    await cluster.start()
    namespace = await new_namespace(cluster)
    await cluster.client.create(configmap("x", namespace, v="1"))
    await cluster.cache.list(CONFIGMAP, namespace=namespace)
    await cluster.cache.list(NAMESPACE)
    cluster.cache.informer(CONFIGMAP, namespace=namespace, label_selector="a=b")
    widget = await install_widget_crd(cluster)
    await cluster.cache.list(widget)
    assert len(cluster.cache.informers()) == 4
    assert len(asyncio.all_tasks()) > len(tasks_before)
    assert len(_sockets()) > len(sockets_before)
    await cluster.kubernetes_configuration()  # typed clients need the key as a file until the stop
    material = cluster.transport._material
    assert material is not None
    private = {fd: os.fstat(fd).st_ino for fd in material._fds}  # the in-memory certificate and key
    assert private

    await cluster.stop()
    await asyncio.sleep(0)  # let closed transports drop their sockets

    assert asyncio.all_tasks() == tasks_before
    assert _sockets() <= sockets_before
    assert not any(_open(fd, inode) for fd, inode in private.items())


async def test_the_cluster_reports_health_and_serves_typed_clients(fleet: Fleet) -> None:
    from kubernetes_asyncio import client as k8s

    async with running_cluster(fleet["cluster-2"]) as cluster:
        before = cluster.health
        assert before.last_contact is None
        await cluster.client.list(NAMESPACE)
        after = cluster.health
        assert after.healthy
        assert after.last_contact is not None
        configuration = await cluster.kubernetes_configuration()
        async with k8s.ApiClient(configuration) as api_client:
            namespaces = await k8s.CoreV1Api(api_client).list_namespace()
        assert any(item.metadata.name == "default" for item in namespaces.items)


async def test_a_stopped_cluster_cannot_be_restarted(fleet: Fleet) -> None:
    async with running_cluster(fleet["cluster-2"]) as cluster:
        pass
    assert cluster.stopped
    with pytest.raises(RuntimeError, match="was stopped"):
        await cluster.start()


async def test_clusters_share_discovery_and_keep_one_connection_for_their_watch(fleet: Fleet) -> None:
    import asyncio.sslproto

    async with (
        running_cluster(fleet["cluster-1"], "one") as one,
        running_cluster(fleet["cluster-2"], "two") as two,
    ):
        for cluster in (one, two):
            await cluster.cache.list(CONFIGMAP)
        # The same resource from two servers is one shared object.
        assert (await one.client.resource(CONFIGMAP)) is (await two.client.resource(CONFIGMAP))
        # Discovery asked one question at a time, and the list's connection went on to carry the
        # watch; the health probe (GET /version every few seconds) keeps one more for its requests:
        # at most two TLS connections each, with the smaller read buffer.
        assert asyncio.sslproto.SSLProtocol.max_size == 64 * 1024
        assert _connections(one) <= 2 and _connections(two) <= 2


def _open(fd: int, inode: int) -> bool:
    """Whether ``fd`` still refers to the same in-memory file (the number may be reused)."""
    try:
        return os.fstat(fd).st_ino == inode
    except OSError:
        return False


def _connections(cluster: mcr.Cluster) -> int:
    session = cluster.transport._session  # what the pool holds is what stays resident
    assert session is not None and session.requests is not None
    count = session.requests.connections
    if session._http is not None:  # aiohttp's, made only for a watch without HTTP/2 or a proxy
        connector = session._http.connector
        assert connector is not None
        count += len(connector._acquired) + sum(len(idle) for idle in connector._conns.values())
    return count


async def test_a_stop_cancelled_halfway_still_closes_everything(fleet: Fleet) -> None:
    tasks_before = asyncio.all_tasks()
    cluster = mcr.Cluster("interrupted", mcr.kubeconfig_from_dict(fleet["cluster-1"].kubeconfig()))
    await cluster.start()
    await cluster.cache.list(CONFIGMAP)
    await cluster.kubernetes_configuration()
    material = cluster.transport._material
    assert material is not None
    private = {fd: os.fstat(fd).st_ino for fd in material._fds}
    assert private
    released = asyncio.Event()

    async def slow_goodbye() -> None:
        await released.wait()  # a stop callback that takes its time

    cluster.on_stop(slow_goodbye)
    stopping = asyncio.create_task(cluster.stop())
    await wait_until(lambda: cluster.stopped, timeout=5)
    stopping.cancel()
    with pytest.raises(asyncio.CancelledError):
        await stopping
    released.set()
    await cluster.stop()  # a later caller waits for the same teardown to finish
    assert cluster.transport._session is None
    assert not any(_open(fd, inode) for fd, inode in private.items())
    await asyncio.sleep(0)
    assert asyncio.all_tasks() == tasks_before
