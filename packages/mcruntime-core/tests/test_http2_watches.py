"""Watches ride HTTP/2 streams of a few shared connections, and stay as isolated as before.

Under HTTP/1.1 each watch holds a socket, so a process watching 10,000
clusters holds 10,000 of them. kube-apiserver offers HTTP/2: every watch of
the clusters that share a connection pool opens as a stream of one
connection. What must not change: each watch carries its own cluster's
credential, a reader that stops stalls only its own stream, and a server that
stops answering is noticed and its watches reopen once it answers again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import subprocess
import sys
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from contextlib import AsyncExitStack
from typing import Any, cast

import pytest
from kube_helpers import CONFIGMAP, configmap, connections_to, hung, new_namespace, running_cluster, unique

import mcruntime as mcr
from mcruntime._client.multiplex import STREAM_WINDOW, Multiplexer, Stream
from mcruntime.cache import Informer
from mcruntime.client import WatchEvent
from mcruntime.testing import ControlPlane, Fleet, wait_until


def _config(plane: ControlPlane, user: object = None) -> mcr.ClusterConfig:
    return mcr.kubeconfig_from_dict(plane.kubeconfig(user))  # type: ignore[arg-type]


def _watch(cluster: mcr.Cluster, namespace: str, **options: Any) -> AsyncGenerator[WatchEvent, None]:
    """A ConfigMap watch without bookmarks (unless asked), closed explicitly by the test."""
    options.setdefault("allow_bookmarks", False)
    return cast(
        "AsyncGenerator[WatchEvent, None]", cluster.client.watch(CONFIGMAP, namespace=namespace, **options)
    )


def _multiplexer(cluster: mcr.Cluster) -> Multiplexer:
    found = cluster.transport._multiplexer()
    assert found is not None, "the server offers HTTP/2: watches should be multiplexed"
    return found


def _recorder(names: set[str]) -> Any:
    def record(obj: dict[str, Any], _initial: bool) -> None:
        names.add(obj["metadata"]["name"])

    return record


@contextlib.asynccontextmanager
async def _watching(clusters: list[mcr.Cluster], namespace: str) -> AsyncIterator[list[set[str]]]:
    """An informer per cluster on ``namespace``, synced; yields the names each has seen."""
    seen: list[set[str]] = [set() for _ in clusters]
    tasks = []
    try:
        for cluster, names in zip(clusters, seen, strict=True):
            informer = Informer(cluster.client, CONFIGMAP, namespace=namespace)
            informer.add_handler(mcr.ResourceEventHandler(on_add=_recorder(names)))
            tasks.append(asyncio.create_task(informer.run()))
            assert await informer.wait_for_sync(30)
        yield seen
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def _all_saw(seen: list[set[str]], name: str) -> Callable[[], bool]:
    return lambda: all(name in names for names in seen)


async def _fleet(
    stack: AsyncExitStack, plane: ControlPlane, users: list[object], http2: bool
) -> list[mcr.Cluster]:
    """Clusters started one after another, each answered before the next: few pooled connections."""
    options = mcr.ClusterOptions(http2_watches=http2)
    clusters = []
    for i, user in enumerate(users):
        cluster = await stack.enter_async_context(mcr.Cluster(f"tenant-{i}", _config(plane, user), options))
        await cluster.client.list(CONFIGMAP, namespace="default")
        clusters.append(cluster)
    return clusters


async def test_the_watches_of_a_servers_clusters_share_one_connection(fresh_cluster: ControlPlane) -> None:
    plane = fresh_cluster
    port = plane.apiserver.port
    users: list[object] = [plane.add_token_user(unique("mux")) for _ in range(12)]
    async with running_cluster(plane) as admin:
        namespace = await new_namespace(admin)
        counted: dict[bool, int] = {}
        for http2 in (False, True):
            async with AsyncExitStack() as stack:
                clusters = await _fleet(stack, plane, users, http2)
                async with _watching(clusters, namespace) as seen:
                    name = unique(f"h2-{http2}".lower())
                    await admin.client.create(configmap(name, namespace))
                    await wait_until(_all_saw(seen, name), timeout=30)
                    counted[http2] = connections_to(port)
                    if http2:
                        multiplexers = {id(_multiplexer(cluster)) for cluster in clusters}
                        assert len(multiplexers) == 1 and len(_multiplexer(clusters[0])) == 1
                        streams = [s for c in clusters for s in c.transport._streams]
                        assert len(streams) == len(clusters) and all(isinstance(s, Stream) for s in streams)
                    else:
                        assert all(cluster.transport._multiplexer() is None for cluster in clusters)
        print(
            f"connections for {len(users)} watching clusters: HTTP/1.1 {counted[False]}, HTTP/2 {counted[True]}"
        )
        # A socket per watch, and then one for all of them (plus the pool's few for requests, and the admin's).
        assert counted[False] >= len(users)
        assert counted[True] <= counted[False] - len(users) + 2


async def test_watches_beyond_the_servers_stream_limit_open_another_connection(testbed: Fleet) -> None:
    """The server allows 3 streams per connection: 7 watches ride 3 connections, none refused."""
    plane = testbed.add(extra_args=("--http2-max-streams-per-connection=3",))
    try:
        users: list[object] = [plane.add_token_user(unique("limit")) for _ in range(7)]
        async with running_cluster(plane) as admin, AsyncExitStack() as stack:
            namespace = await new_namespace(admin)
            clusters = await _fleet(stack, plane, users, http2=True)
            async with _watching(clusters, namespace) as seen:
                await admin.client.create(configmap("limited", namespace))
                await wait_until(_all_saw(seen, "limited"), timeout=30)
                multiplexer = _multiplexer(clusters[0])
                assert len(multiplexer) == 3
                assert all(isinstance(s, Stream) for c in clusters for s in c.transport._streams)
    finally:
        testbed.remove(plane.name)


async def test_each_watch_carries_its_own_clusters_credential(fresh_cluster: ControlPlane) -> None:
    """A token user who may not list ConfigMaps is refused its watch; its partner's opens beside it."""
    plane = fresh_cluster
    allowed = plane.add_token_user(unique("allowed"))
    refused = plane.add_token_user(unique("refused"), cluster_admin=False)
    async with AsyncExitStack() as stack:
        good, bad = [
            await stack.enter_async_context(mcr.Cluster(name, _config(plane, user)))
            for name, user in (("allowed", allowed), ("refused", refused))
        ]
        events = _watch(good, "default")
        got = asyncio.ensure_future(anext(events))
        try:
            denied = _watch(bad, "default")
            with pytest.raises(mcr.Forbidden, match="configmaps"):
                await anext(denied)
            await denied.aclose()
            await good.client.create(configmap(unique("credential"), "default"))
            event = await asyncio.wait_for(got, 30)
            assert event.type == "ADDED"
            assert _multiplexer(good) is _multiplexer(bad) and len(_multiplexer(good)) == 1
        finally:
            got.cancel()
            await asyncio.gather(got, return_exceptions=True)
            await events.aclose()


def _unread(cluster: mcr.Cluster) -> int:
    return max((s.unread for s in cluster.transport._streams if isinstance(s, Stream)), default=0)


async def test_a_watch_nobody_reads_stalls_only_its_own_stream(fresh_cluster: ControlPlane) -> None:
    async with running_cluster(fresh_cluster) as cluster:
        stalled_namespace, live_namespace = await new_namespace(cluster), await new_namespace(cluster)
        stalled = _watch(cluster, stalled_namespace)
        await cluster.client.create(configmap("first", stalled_namespace))
        assert (await anext(stalled)).type == "ADDED"  # open, then never read again
        seen: list[str] = []

        async def read_live() -> None:
            async for event in _watch(cluster, live_namespace):
                seen.append(event.object["metadata"]["name"])

        live = asyncio.create_task(read_live())
        try:
            await cluster.client.create(configmap("opened", live_namespace))
            await wait_until(lambda: "opened" in seen or live.done(), timeout=30)
            assert not live.done(), live.exception()
            assert len(_multiplexer(cluster)) == 1  # both watches on one connection
            # Twice the stream's window in events nobody reads: the server must stop at the window.
            for i in range(8):
                await cluster.client.create(
                    configmap(f"bulk-{i}", stalled_namespace, data="x" * (STREAM_WINDOW // 4))
                )
            await wait_until(
                lambda: _unread(cluster) > STREAM_WINDOW // 2, timeout=30, what="the stalled window filled"
            )
            await cluster.client.create(configmap("after", live_namespace))
            await wait_until(lambda: "after" in seen, timeout=30, what="the live watch went on")
            assert _unread(cluster) <= STREAM_WINDOW  # flow control held the rest back at the server
        finally:
            live.cancel()
            await asyncio.gather(live, return_exceptions=True)
            await stalled.aclose()


async def _past_bookmarks(watch: AsyncGenerator[WatchEvent, None]) -> None:
    """Read the bookmarks that arrived before the server stopped; anything else is a failure."""
    async for event in watch:
        assert event.type == "BOOKMARK", event


async def test_a_connection_whose_server_stops_answering_is_dropped_after_a_ping(
    fresh_cluster: ControlPlane,
) -> None:
    """A watch silent for its read timeout pings; no answer drops the connection and the next watch opens anew."""
    options = mcr.ClusterOptions(connect_timeout=2.0, health_probe_interval=60.0)
    async with running_cluster(fresh_cluster, options=options) as cluster:
        namespace = await new_namespace(cluster)
        watch = _watch(cluster, namespace, read_timeout=1.0, allow_bookmarks=True)
        await cluster.client.create(configmap("before", namespace))
        assert (await anext(watch)).type == "ADDED"
        multiplexer = _multiplexer(cluster)
        assert len(multiplexer) == 1
        with hung(fresh_cluster):
            with pytest.raises(mcr.Unreachable, match=r"silent for 1\.0s"):
                await _past_bookmarks(watch)
            await watch.aclose()
            await wait_until(
                lambda: len(multiplexer) == 0, timeout=15, what="the unanswered PING dropped the connection"
            )
        await wait_until(lambda: cluster.health.healthy, timeout=60)
        again = _watch(cluster, namespace)
        try:
            await cluster.client.create(configmap("after", namespace))
            event = await asyncio.wait_for(anext(again), 30)
            assert event.object["metadata"]["name"] == "after" and len(multiplexer) == 1
        finally:
            await again.aclose()


async def test_a_server_shutting_down_sends_goaway_and_its_watches_reopen_once_it_is_back(
    fresh_cluster: ControlPlane, caplog: pytest.LogCaptureFixture
) -> None:
    """A graceful stop of kube-apiserver sends GOAWAY: it is named in the log, and nothing is lost."""
    caplog.set_level(logging.INFO, logger="mcruntime.transport")
    options = mcr.ClusterOptions(retry=mcr.RetryPolicy(attempts=1))
    async with running_cluster(fresh_cluster, options=options) as cluster:
        namespace = await new_namespace(cluster)
        informer = cluster.cache.informer(CONFIGMAP, namespace=namespace)
        assert await informer.wait_for_sync(30)
        await cluster.client.create(configmap("before", namespace))  # seen through the watch: it is open
        await wait_until(lambda: informer.get(f"{namespace}/before") is not None, what="the watch")
        multiplexer = _multiplexer(cluster)
        assert len(multiplexer) == 1 and multiplexer.goaways == 0

        await fresh_cluster.apiserver.stop_async()  # SIGTERM: the server drains its HTTP/2 connections
        await wait_until(lambda: multiplexer.goaways == 1, what="the server's GOAWAY")
        await wait_until(lambda: len(multiplexer) == 0, what="the drained connection closed")
        said = [r.getMessage() for r in caplog.records if "GOAWAY" in r.getMessage()]
        assert said and multiplexer.name in said[0], said

        await fresh_cluster.apiserver.start_async()
        await cluster.client.create(configmap("after", namespace))
        await wait_until(
            lambda: informer.get(f"{namespace}/after") is not None, timeout=60, what="the reopened watch"
        )
        assert len(multiplexer) == 1 and multiplexer.goaways == 1


async def test_without_http2_each_watch_keeps_a_connection_of_its_own(fresh_cluster: ControlPlane) -> None:
    options = mcr.ClusterOptions(http2_watches=False)
    async with running_cluster(fresh_cluster, options=options) as cluster:
        namespace = await new_namespace(cluster)
        async with _watching([cluster], namespace) as seen:
            await cluster.client.create(configmap("plain", namespace))
            await wait_until(lambda: "plain" in seen[0], timeout=30)
            assert cluster.transport._multiplexer() is None
            assert not any(isinstance(s, Stream) for s in cluster.transport._streams)


def test_http2_is_imported_with_the_first_watch_not_with_mcruntime() -> None:
    """A program that never watches (a CLI, a webhook) does not pay for the HTTP/2 stack at import."""
    code = (
        "import sys, mcruntime; "
        "print(sorted(m for m in ('mcruntime._client.wire', 'hpack', 'h2') if m in sys.modules))"
    )
    found = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert found.stdout.strip() == "[]", found.stdout
