"""A controller's one waiting worker: requests that come one at a time start where they land.

No cluster is involved: requests arrive through a channel, as a provider's
or a mapper's would.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import mcruntime as mcr
from mcruntime.testing import wait_until


def _controller(
    reconcile: mcr.ReconcileFunction, *, total: int = 4
) -> tuple[mcr.Controller, asyncio.Queue[mcr.Request | mcr.ObjectEvent]]:
    channel: asyncio.Queue[mcr.Request | mcr.ObjectEvent] = asyncio.Queue()
    controller = mcr.Controller(
        "waiting", reconcile, max_concurrent_reconciles=total, max_total_reconciles=total
    )
    controller.watch(mcr.ChannelSource(channel))
    return controller, channel


def _succeeded(controller: mcr.Controller, count: int) -> Callable[[], bool]:
    return lambda: controller.stats.success == count


def _last_is(seen: list[str], name: str) -> Callable[[], bool]:
    return lambda: seen[-1:] == [name]


async def test_requests_one_at_a_time_run_in_the_same_worker_and_it_counts_as_idle() -> None:
    tasks: list[asyncio.Task[object] | None] = []

    async def reconcile(_request: mcr.Request) -> None:
        tasks.append(asyncio.current_task())

    controller, channel = _controller(reconcile)
    runner = asyncio.create_task(controller.start())
    for index in range(5):
        await channel.put(mcr.Request("east", "ns", f"cm-{index}"))
        await wait_until(_succeeded(controller, index + 1))
        # Done and waiting for the next: not a busy worker, holding no request.
        await wait_until(lambda: controller.active_workers == 0)
        assert controller.queue.processing_count == 0
    assert len(tasks) == 5
    assert len(set(tasks)) == 1  # the first request's worker ran the other four too
    assert await controller.shutdown(1) is True
    await runner
    assert not any(task is not None and not task.done() for task in tasks)


async def test_requests_that_arrive_while_the_worker_is_busy_still_run_side_by_side() -> None:
    release = asyncio.Event()
    running: set[str] = set()
    most = 0

    async def reconcile(request: mcr.Request) -> None:
        nonlocal most
        running.add(request.name)
        most = max(most, len(running))
        await release.wait()
        running.discard(request.name)

    controller, channel = _controller(reconcile, total=3)
    runner = asyncio.create_task(controller.start())
    await channel.put(mcr.Request("east", "ns", "first"))
    await wait_until(lambda: controller.stats.success == 0 and running == {"first"})
    release.set()
    await wait_until(lambda: controller.stats.success == 1 and controller.active_workers == 0)
    release.clear()
    for name in ("a", "b", "c", "d"):
        await channel.put(mcr.Request("east", "ns", name))
    # Three slots: the waiting worker takes one request, the dispatcher starts two more.
    await wait_until(lambda: controller.active_workers == 3)
    assert len(running) == 3
    release.set()
    await wait_until(lambda: controller.stats.success == 5)
    assert most == 3
    assert await controller.shutdown(1) is True
    await runner


async def test_one_slot_is_enough_for_the_waiting_worker_and_shutdown_ends_it() -> None:
    seen: list[str] = []

    async def reconcile(request: mcr.Request) -> None:
        seen.append(request.name)

    controller, channel = _controller(reconcile, total=1)
    runner = asyncio.create_task(controller.start())
    for name in ("a", "b", "c"):
        await channel.put(mcr.Request("east", "ns", name))
        await wait_until(_last_is(seen, name))
    assert seen == ["a", "b", "c"]
    await wait_until(lambda: controller.active_workers == 0)
    assert await controller.shutdown(1) is True
    await asyncio.wait_for(runner, 10)


async def test_a_cancelled_waiting_worker_leaves_the_counts_straight() -> None:
    async def reconcile(_request: mcr.Request) -> None:
        return None

    controller, channel = _controller(reconcile)
    runner = asyncio.create_task(controller.start())
    await channel.put(mcr.Request("east", "ns", "only"))
    await wait_until(lambda: controller.stats.success == 1 and controller.active_workers == 0)
    runner.cancel()  # as a lost leadership or a stopped manager cancels what runs
    await asyncio.gather(runner, return_exceptions=True)
    assert controller.active_workers == 0
    assert controller.queue.processing_count == 0
