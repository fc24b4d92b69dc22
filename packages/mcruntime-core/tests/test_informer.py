"""Informers against real API servers: events, 410 relists, outages, silence."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Iterator

import pytest
from kube_helpers import CONFIGMAP, configmap, new_namespace, running_cluster, stop

import mcruntime as mcr
from mcruntime.cache import Informer
from mcruntime.testing import ControlPlane, Fleet, wait_until


class Recorder:
    """Collects informer events as (type, name, value) tuples."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str, str | None]] = []

    def handler(self) -> mcr.ResourceEventHandler:
        return mcr.ResourceEventHandler(
            on_add=lambda obj, _initial: self._record("add", obj),
            on_update=lambda _old, new: self._record("update", new),
            on_delete=lambda obj: self._record("delete", obj),
        )

    def _record(self, kind: str, obj: mcr.Kind | dict[str, object]) -> None:
        assert isinstance(obj, dict)
        metadata = obj["metadata"]
        assert isinstance(metadata, dict)
        data = obj.get("data") or {}
        assert isinstance(data, dict)
        self.events.append((kind, str(metadata["name"]), data.get("v")))

    def of(self, name: str) -> list[tuple[str, str | None]]:
        return [(kind, value) for kind, event_name, value in self.events if event_name == name]


def _store_view(informer: Informer) -> dict[str, str]:
    return {key: obj["metadata"]["resourceVersion"] for key, obj in informer.store.objects.items()}


async def _fresh_list_view(cluster: mcr.Cluster, namespace: str) -> dict[str, str]:
    listed = await cluster.client.list(CONFIGMAP, namespace=namespace)
    return {f"{namespace}/{o['metadata']['name']}": o["metadata"]["resourceVersion"] for o in listed.items}


async def test_an_informer_sees_add_update_and_delete(fleet: Fleet) -> None:
    async with running_cluster(fleet["cluster-1"]) as cluster:
        namespace = await new_namespace(cluster)
        informer = cluster.cache.informer(CONFIGMAP, namespace=namespace)
        recorder = Recorder()
        informer.add_handler(recorder.handler())
        assert await informer.wait_for_sync(30)
        await cluster.client.create(configmap("watched", namespace, v="1"))
        await cluster.client.patch(CONFIGMAP, "watched", {"data": {"v": "2"}}, namespace=namespace)
        await cluster.client.delete(CONFIGMAP, "watched", namespace=namespace)
        await wait_until(lambda: len(recorder.of("watched")) == 3)
        assert recorder.of("watched") == [("add", "1"), ("update", "2"), ("delete", "2")]
        assert informer.store.objects == {}


async def test_handlers_come_and_go_and_late_ones_get_the_current_objects(fleet: Fleet) -> None:
    async with running_cluster(fleet["cluster-1"]) as cluster:
        namespace = await new_namespace(cluster)
        await cluster.client.create(configmap("existing", namespace, v="0"))
        informer = cluster.cache.informer(CONFIGMAP, namespace=namespace)
        assert await informer.wait_for_sync(30)
        late = Recorder()
        registration = informer.add_handler(late.handler())
        assert late.of("existing") == [("add", "0")]
        registration.remove()
        await cluster.client.create(configmap("after-removal", namespace, v="1"))
        await wait_until(lambda: f"{namespace}/after-removal" in informer.store.objects)
        assert late.of("after-removal") == []
        assert informer.handler_count == 0


async def test_managed_fields_are_dropped_by_default(fleet: Fleet) -> None:
    async with running_cluster(fleet["cluster-1"]) as cluster:
        namespace = await new_namespace(cluster)
        created = await cluster.client.create(configmap("slim", namespace, v="1"), field_manager="tests")
        assert created["metadata"]["managedFields"]
        cached = await cluster.cache.get_or_none(CONFIGMAP, "slim", namespace=namespace)
        assert cached is not None
        assert "managedFields" not in cached["metadata"]


@pytest.fixture
def uncached_cluster(testbed: Fleet) -> Iterator[ControlPlane]:
    """A cluster whose apiserver serves watches from etcd, so compaction expires them."""
    plane = testbed.add(extra_args=("--watch-cache=false",))
    try:
        yield plane
    finally:
        testbed.remove(plane.name)


async def test_a_watch_from_a_compacted_version_relists_and_emits_the_difference(
    uncached_cluster: ControlPlane, testbed: Fleet
) -> None:
    async with running_cluster(uncached_cluster) as cluster:
        namespace = await new_namespace(cluster)
        for name in ("kept", "changed", "deleted"):
            await cluster.client.create(configmap(name, namespace, v="1"))
        informer = Informer(cluster.client, CONFIGMAP, namespace=namespace)
        recorder = Recorder()
        informer.add_handler(recorder.handler())
        run = asyncio.create_task(informer.run())
        assert await informer.wait_for_sync(30)
        run.cancel()
        await asyncio.gather(run, return_exceptions=True)
        recorder.events.clear()

        # While nobody watches: change, delete, create; then compact the history away.
        await cluster.client.patch(CONFIGMAP, "changed", {"data": {"v": "2"}}, namespace=namespace)
        await cluster.client.delete(CONFIGMAP, "deleted", namespace=namespace)
        await cluster.client.create(configmap("created", namespace, v="1"))
        await asyncio.to_thread(testbed.compact)

        run = asyncio.create_task(informer.run())
        try:
            await wait_until(lambda: informer.stats.relists_after_gone >= 1)
            await wait_until(lambda: len(recorder.events) >= 3)
            assert sorted(recorder.events) == [
                ("add", "created", "1"),
                ("delete", "deleted", "1"),
                ("update", "changed", "2"),
            ]
            assert _store_view(informer) == await _fresh_list_view(cluster, namespace)
        finally:
            run.cancel()
            await asyncio.gather(run, return_exceptions=True)


async def test_nothing_is_lost_across_an_apiserver_outage(fresh_cluster: ControlPlane) -> None:
    options = mcr.ClusterOptions(retry=mcr.RetryPolicy(attempts=1))
    async with running_cluster(fresh_cluster, options=options) as cluster:
        namespace = await new_namespace(cluster)
        for name in ("kept", "changed", "deleted"):
            await cluster.client.create(configmap(name, namespace, v="1"))
        informer = cluster.cache.informer(CONFIGMAP, namespace=namespace)
        recorder = Recorder()
        informer.add_handler(recorder.handler())
        assert await informer.wait_for_sync(30)
        recorder.events.clear()

        secondary = await asyncio.to_thread(fresh_cluster.start_secondary)
        await fresh_cluster.apiserver.stop_async()
        # The side door is another server of the same data: a cluster of its own (it must not
        # share the primary's reachability, which is down).
        side_config = mcr.kubeconfig_from_dict(secondary.kubeconfig(), trust=mcr.TrustPolicy.untrusted())
        async with mcr.Cluster("side-door", side_config) as side:
            await side.client.patch(CONFIGMAP, "changed", {"data": {"v": "2"}}, namespace=namespace)
            await side.client.delete(CONFIGMAP, "deleted", namespace=namespace)
            await side.client.create(configmap("created", namespace, v="1"))
        await wait_until(lambda: informer.stats.last_error is not None)

        await fresh_cluster.apiserver.start_async()
        await wait_until(lambda: len(recorder.events) >= 3, timeout=60)
        assert sorted(recorder.events) == [
            ("add", "created", "1"),
            ("delete", "deleted", "1"),
            ("update", "changed", "2"),
        ]
        await wait_until(
            lambda: (
                _store_view(informer).keys() == {f"{namespace}/{n}" for n in ("kept", "changed", "created")}
            )
        )
        assert _store_view(informer) == await _fresh_list_view(cluster, namespace)


async def test_a_silent_connection_is_noticed_within_the_read_timeout(fresh_cluster: ControlPlane) -> None:
    options = mcr.ClusterOptions(
        watch_read_timeout=2.0, retry=mcr.RetryPolicy(attempts=1), request_timeout=2.0
    )
    async with running_cluster(fresh_cluster, options=options) as cluster:
        namespace = await new_namespace(cluster)
        informer = cluster.cache.informer(CONFIGMAP, namespace=namespace)
        assert await informer.wait_for_sync(30)
        process = fresh_cluster.apiserver.process
        assert process is not None and process.pid is not None
        stop(process.pid)  # the socket stays open, but nothing arrives
        try:
            await wait_until(lambda: informer.stats.last_error is not None, timeout=15)
            # The read timeout, or the health probe's (5 s) if it notices first and closes the watch.
            assert any(
                words in (informer.stats.last_error or "") for words in ("silent", "timed out", "no answer")
            )
        finally:
            os.kill(process.pid, signal.SIGCONT)
        await cluster.client.create(configmap("after", namespace, v="1"))
        await wait_until(lambda: f"{namespace}/after" in informer.store.objects, timeout=60)


async def test_a_relist_after_410_across_several_namespaces_emits_each_ones_difference_only(
    uncached_cluster: ControlPlane, testbed: Fleet
) -> None:
    """A scoped informer watches each namespace; a 410 relists them all, and nothing outside the scope."""
    async with running_cluster(uncached_cluster) as cluster:
        first, second, third, outside = [await new_namespace(cluster) for _ in range(4)]
        for namespace in (first, second, third, outside):
            await cluster.client.create(configmap("a", namespace, v="1"))
        informer = Informer(cluster.client, CONFIGMAP, namespaces=[first, second, third])
        recorder = Recorder()
        informer.add_handler(recorder.handler())
        run = asyncio.create_task(informer.run())
        assert await informer.wait_for_sync(30)
        run.cancel()
        await asyncio.gather(run, return_exceptions=True)
        recorder.events.clear()

        # While nobody watches, one change per selected namespace and one outside; then compact.
        await cluster.client.patch(CONFIGMAP, "a", {"data": {"v": "2"}}, namespace=first)
        await cluster.client.delete(CONFIGMAP, "a", namespace=second)
        await cluster.client.create(configmap("b", third, v="1"))
        await cluster.client.create(configmap("b", outside, v="1"))
        await asyncio.to_thread(testbed.compact)

        run = asyncio.create_task(informer.run())
        try:
            await wait_until(lambda: informer.stats.relists_after_gone >= 1)
            await wait_until(lambda: len(recorder.events) >= 3)
            assert sorted(recorder.events) == [("add", "b", "1"), ("delete", "a", "1"), ("update", "a", "2")]
            fresh: dict[str, str] = {}
            for namespace in (first, second, third):
                fresh.update(await _fresh_list_view(cluster, namespace))
            assert _store_view(informer) == fresh
            assert not any(key.startswith(f"{outside}/") for key in informer.store.objects)
        finally:
            run.cancel()
            await asyncio.gather(run, return_exceptions=True)
