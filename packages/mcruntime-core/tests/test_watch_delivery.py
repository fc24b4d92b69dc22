"""The informer's watch path: on HTTP/2, events are handled inside the connection's read.

Read through an ``async for``, every event that trickles in wakes the reading
task: one more event-loop iteration per event (benchmark S8). The informer
instead hands the client a callback (``Client._watch_each``) that the HTTP/2
stream calls as it reads. These tests hold the promises that come with it,
against a real API server: the callback runs in the informer's context and
without a task, flow control still reopens the window, and a callback that
raises ends only its own watch, with the error raised to the caller and the
stream given back; a namespaced view stays pinned, and a client that overrides
``watch`` is still read through its override.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
from collections.abc import AsyncIterator
from typing import Any

import pytest
from kube_helpers import CONFIGMAP, configmap, new_namespace, running_cluster

import mcruntime as mcr
from mcruntime._client.multiplex import STREAM_WINDOW, Stream
from mcruntime._client.watching import WatchRequest
from mcruntime._fleet.namespaced_client import NamespacedClient
from mcruntime.cache import Informer
from mcruntime.client import WatchEvent
from mcruntime.testing import ControlPlane, wait_until

_WHOSE: contextvars.ContextVar[str] = contextvars.ContextVar("whose", default="nobody's")


def _open_streams(cluster: mcr.Cluster) -> list[Stream]:
    return [stream for stream in cluster.transport._streams if isinstance(stream, Stream)]


@contextlib.asynccontextmanager
async def _watching(informer: Informer, cluster: mcr.Cluster) -> AsyncIterator[asyncio.Task[None]]:
    """``informer`` running, synced and with its watch open (an HTTP/2 stream); stopped after."""
    task = asyncio.create_task(informer.run())
    try:
        assert await informer.wait_for_sync(30)
        await wait_until(
            lambda: len(_open_streams(cluster)) == 1, timeout=30, what="the watch's HTTP/2 stream"
        )
        yield task
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_an_informers_events_are_handled_in_the_read_in_its_own_context(
    fresh_cluster: ControlPlane,
) -> None:
    async with running_cluster(fresh_cluster) as cluster:
        namespace = await new_namespace(cluster)
        seen: list[tuple[str, asyncio.Task[object] | None, str]] = []

        def record(obj: dict[str, object], initial: bool) -> None:
            if not initial:
                name = obj["metadata"]["name"]  # type: ignore[index]
                seen.append((str(name), asyncio.current_task(), _WHOSE.get()))

        informer = Informer(cluster.client, CONFIGMAP, namespace=namespace)
        informer.add_handler(mcr.ResourceEventHandler(on_add=record))
        _WHOSE.set("the informer's")  # the informer's task starts with a copy of this context
        async with _watching(informer, cluster) as task:
            await cluster.client.create(configmap("first", namespace))
            await wait_until(lambda: len(seen) == 1, timeout=30, what="the event of 'first'")
            assert seen == [("first", None, "the informer's")]  # no task woke for it
            # Twice the stream's window: the windows must reopen as the read hands the data on.
            for i in range(8):
                await cluster.client.create(
                    configmap(f"bulk-{i}", namespace, data="x" * (STREAM_WINDOW // 4))
                )
            await wait_until(lambda: len(seen) == 9, timeout=30, what="every bulk event")
            assert {name for name, _task, _whose in seen} == {"first", *(f"bulk-{i}" for i in range(8))}
            assert not task.done()
        assert _open_streams(cluster) == []


class _Enough(Exception):
    """The test's handler has seen what it wanted."""


async def test_a_handler_that_raises_ends_its_watch_alone_and_gives_the_stream_back(
    fresh_cluster: ControlPlane,
) -> None:
    async with running_cluster(fresh_cluster) as cluster:
        namespace = await new_namespace(cluster)
        for name in ("a", "b"):
            await cluster.client.create(configmap(name, namespace))
        other: list[str] = []
        other_task = asyncio.create_task(
            cluster.client._watch_each(
                WatchRequest(CONFIGMAP, namespace=namespace, allow_bookmarks=False),
                lambda event: other.append(event.object["metadata"]["name"]),
            )
        )
        try:
            await wait_until(lambda: len(other) == 2, timeout=30, what="the other watch's first events")
            handled: list[str] = []

            def handle(event: WatchEvent) -> None:
                handled.append(event.object["metadata"]["name"])
                raise _Enough(event.object["metadata"]["name"])

            request = WatchRequest(CONFIGMAP, namespace=namespace, allow_bookmarks=False)
            watch = cluster.client._watch_each(request, handle)
            with pytest.raises(_Enough):
                await asyncio.wait_for(watch, 30)
            assert len(handled) == 1  # the event after the one that raised was not handed on
            assert len(_open_streams(cluster)) == 1  # the other watch's
            multiplexer = cluster.transport._multiplexer()
            assert multiplexer is not None
            # The failed watch's stream was reset on the connection, not left for the server to fill.
            assert sum(len(channel.streams) for channel in multiplexer._channels) == 1
            await cluster.client.create(configmap("c", namespace))
            await wait_until(lambda: "c" in other, timeout=30, what="the other watch went on")
            assert not other_task.done()
        finally:
            other_task.cancel()
            await asyncio.gather(other_task, return_exceptions=True)


async def test_a_namespaced_views_informer_is_pinned_to_its_namespace(fresh_cluster: ControlPlane) -> None:
    async with running_cluster(fresh_cluster) as cluster:
        mine, other = await new_namespace(cluster), await new_namespace(cluster)
        view = NamespacedClient(cluster.client, mine, "tenant")
        with pytest.raises(mcr.Forbidden, match="outside it"):
            await view._watch_each(WatchRequest(CONFIGMAP, namespace=other), lambda _event: None)
        seen: list[str] = []

        def record(obj: dict[str, object], initial: bool) -> None:
            if not initial:
                seen.append(f"{obj['metadata']['namespace']}/{obj['metadata']['name']}")  # type: ignore[index]

        informer = Informer(view, CONFIGMAP)  # no namespace given: the view's
        informer.add_handler(mcr.ResourceEventHandler(on_add=record))
        async with _watching(informer, cluster):
            await cluster.client.create(configmap("elsewhere", other))
            await cluster.client.create(configmap("here", mine))
            await wait_until(lambda: seen, timeout=30, what="the view's event")
            assert seen == [f"{mine}/here"]
            assert informer.get(f"{other}/elsewhere") is None


class _Tagging(mcr.Client):
    """A user's client that changes what ``watch`` yields: its informers must read through it."""

    async def watch(self, kind: mcr.Kind, **options: Any) -> AsyncIterator[WatchEvent]:
        async for event in super().watch(kind, **options):
            if event.type != "BOOKMARK":
                event.object["metadata"].setdefault("labels", {})["seen-by"] = "tagging"
            yield event


async def test_a_client_that_overrides_watch_feeds_its_informers_through_it(
    fresh_cluster: ControlPlane,
) -> None:
    async with running_cluster(fresh_cluster) as cluster:
        namespace = await new_namespace(cluster)
        client = _Tagging(cluster.client.transport, cluster.client.discovery, cluster=cluster.name)
        labels: list[object] = []

        def record(obj: dict[str, Any], initial: bool) -> None:
            if not initial:
                labels.append(obj["metadata"].get("labels"))

        informer = Informer(client, CONFIGMAP, namespace=namespace)
        informer.add_handler(mcr.ResourceEventHandler(on_add=record))
        async with _watching(informer, cluster):
            await cluster.client.create(configmap("tagged", namespace))
            await wait_until(lambda: labels, timeout=30, what="the event of 'tagged'")
            assert labels == [{"seen-by": "tagging"}]
