"""How a controller treats a reconcile's outcome, without any cluster involved."""

from __future__ import annotations

import asyncio
import logging
from collections import Counter

import pytest

import mcruntime as mcr
from mcruntime._reconcile.request import as_reconcile_function
from mcruntime.testing import wait_until
from mcruntime.workqueue import ExponentialBackoff


def _controller(
    reconcile: mcr.ReconcileFunction,
) -> tuple[mcr.Controller, asyncio.Queue[mcr.Request | mcr.ObjectEvent]]:
    channel: asyncio.Queue[mcr.Request | mcr.ObjectEvent] = asyncio.Queue()
    controller = mcr.Controller(
        "retries",
        reconcile,
        rate_limiter=ExponentialBackoff(base=0.001, cap=0.05),
        max_concurrent_reconciles=2,
    )
    controller.watch(mcr.ChannelSource(channel))
    return controller, channel


async def test_exceptions_are_retried_with_backoff_until_they_succeed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    attempts: Counter[mcr.Request] = Counter()

    async def flaky(request: mcr.Request) -> None:
        attempts[request] += 1
        if attempts[request] < 4:
            raise RuntimeError("not yet")

    controller, channel = _controller(flaky)
    runner = asyncio.create_task(controller.start())
    request = mcr.Request("east", "ns", "flaky")
    with caplog.at_level(logging.ERROR, logger="mcruntime.controller"):
        await channel.put(request)
        await wait_until(lambda: controller.stats.success == 1)
    assert attempts[request] == 4
    assert controller.stats.error == 3
    assert controller.queue.num_requeues(request) == 0  # forgotten after success
    assert "east:ns/flaky" in caplog.text and "Traceback" in caplog.text
    await controller.shutdown(1)
    await runner


async def test_a_terminal_error_is_not_retried() -> None:
    attempts = 0

    async def broken(_request: mcr.Request) -> None:
        nonlocal attempts
        attempts += 1
        raise mcr.TerminalError("the spec can never work")

    controller, channel = _controller(broken)
    runner = asyncio.create_task(controller.start())
    await channel.put(mcr.Request("east", "ns", "x"))
    await wait_until(lambda: controller.stats.terminal == 1)
    await channel.put(mcr.Request("east", "ns", "marker"))
    await wait_until(lambda: controller.stats.terminal == 2)
    assert attempts == 2
    assert len(controller.queue) == 0 and controller.queue.delayed_count == 0
    await controller.shutdown(1)
    await runner


async def test_cluster_not_found_drops_the_request() -> None:
    async def gone(request: mcr.Request) -> None:
        raise mcr.ClusterNotFound(request.cluster)

    controller, channel = _controller(gone)
    runner = asyncio.create_task(controller.start())
    await channel.put(mcr.Request("vanished", "ns", "x"))
    await wait_until(lambda: controller.stats.dropped_cluster_gone == 1)
    assert controller.queue.delayed_count == 0 and len(controller.queue) == 0
    await controller.shutdown(1)
    await runner


async def test_results_requeue_after_a_delay() -> None:
    calls = 0

    async def periodic(_request: mcr.Request) -> mcr.Result | None:
        nonlocal calls
        calls += 1
        return mcr.Result(requeue_after=0.01) if calls < 3 else None

    controller, channel = _controller(periodic)
    runner = asyncio.create_task(controller.start())
    await channel.put(mcr.Request("east", "ns", "x"))
    await wait_until(lambda: calls == 3 and controller.stats.success == 1)
    assert controller.stats.requeue_after == 2
    await controller.shutdown(1)
    await runner


async def test_shutdown_lets_in_flight_reconciles_finish() -> None:
    release = asyncio.Event()
    finished: list[mcr.Request] = []

    async def slow(request: mcr.Request) -> None:
        await release.wait()
        finished.append(request)

    controller, channel = _controller(slow)
    runner = asyncio.create_task(controller.start())
    await channel.put(mcr.Request("east", "ns", "slow"))
    await wait_until(lambda: controller.active_workers == 1)
    shutting = asyncio.create_task(controller.shutdown(5))
    await asyncio.sleep(0)
    release.set()
    assert await shutting is True
    await runner
    assert finished == [mcr.Request("east", "ns", "slow")]


async def test_reconcilers_can_be_objects_with_a_reconcile_method() -> None:
    class Counting:
        def __init__(self) -> None:
            self.seen: list[mcr.Request] = []

        async def reconcile(self, request: mcr.Request) -> None:
            self.seen.append(request)

    counting = Counting()
    controller, channel = _controller(as_reconcile_function(counting))
    runner = asyncio.create_task(controller.start())
    await channel.put(mcr.Request("east", "ns", "x"))
    await wait_until(lambda: counting.seen == [mcr.Request("east", "ns", "x")])
    await controller.shutdown(1)
    await runner


async def test_a_conflict_is_retried_with_one_quiet_line(caplog: pytest.LogCaptureFixture) -> None:
    attempts = 0

    async def stale(_request: mcr.Request) -> None:
        nonlocal attempts
        attempts += 1
        if attempts == 1:
            raise mcr.Conflict("the object has been modified", cluster="east", status=409, reason="Conflict")

    controller, channel = _controller(stale)
    runner = asyncio.create_task(controller.start())
    with caplog.at_level(logging.INFO, logger="mcruntime.controller"):
        await channel.put(mcr.Request("east", "ns", "raced"))
        await wait_until(lambda: controller.stats.success == 1)
    assert attempts == 2 and controller.stats.error == 1
    conflicts = [record for record in caplog.records if "conflict" in record.getMessage()]
    assert [record.levelno for record in conflicts] == [logging.INFO]
    assert conflicts[0].exc_info is None
    await controller.shutdown(1)
    await runner
