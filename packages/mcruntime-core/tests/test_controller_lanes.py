"""Per-cluster lanes in a controller, and a reconciler's mistakes that must not stop it (no cluster)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter

import pytest

import mcruntime as mcr
from mcruntime.testing import wait_until
from mcruntime.workqueue import ExponentialBackoff


def _controller(
    reconcile: mcr.ReconcileFunction, *, lane: int = 1, total: int = 256, turn: int = 32
) -> tuple[mcr.Controller, asyncio.Queue[mcr.Request | mcr.ObjectEvent]]:
    channel: asyncio.Queue[mcr.Request | mcr.ObjectEvent] = asyncio.Queue()
    controller = mcr.Controller(
        "lanes",
        reconcile,
        rate_limiter=ExponentialBackoff(base=0.001, cap=0.05),
        max_concurrent_reconciles=lane,
        max_total_reconciles=total,
        keys_per_turn=turn,
    )
    controller.watch(mcr.ChannelSource(channel))
    return controller, channel


async def test_a_hung_cluster_holds_only_its_own_lane() -> None:
    hang = asyncio.Event()
    done: list[mcr.Request] = []

    async def reconcile(request: mcr.Request) -> None:
        if request.cluster == "hung":
            await hang.wait()
        done.append(request)

    controller, channel = _controller(reconcile)  # default options: lanes of one
    runner = asyncio.create_task(controller.start())
    for index in range(5):
        await channel.put(mcr.Request("hung", "ns", f"h{index}"))
    healthy = [mcr.Request(cluster, "ns", f"o{index}") for index in range(20) for cluster in ("a", "b")]
    for request in healthy:
        await channel.put(request)
    await wait_until(lambda: set(healthy) <= set(done))
    assert controller.queue.processing_by_group() == {"hung": 1}
    assert controller.queue.depth_by_group() == {"hung": 4}
    hang.set()
    await wait_until(lambda: controller.stats.success == 45)
    await controller.shutdown(1)
    await runner


@pytest.mark.parametrize(
    ("turn", "order"), [(1, "ab" * 10), (3, "aaabbb" * 3 + "ab"), (32, "a" * 10 + "b" * 10)]
)
async def test_a_worker_goes_on_with_the_next_ready_request_clusters_taking_turns(
    turn: int, order: str
) -> None:
    """A backlog is worked through by the task already running, not by a task per request."""
    seen: list[tuple[str, asyncio.Task[object] | None]] = []

    async def reconcile(request: mcr.Request) -> None:
        seen.append((request.cluster, asyncio.current_task()))

    controller, _channel = _controller(reconcile, total=1, turn=turn)
    for index in range(10):
        for cluster in ("a", "b"):
            controller.queue.add(mcr.Request(cluster, "ns", str(index)))
    runner = asyncio.create_task(controller.start())
    await wait_until(lambda: len(seen) == 20)
    assert "".join(cluster for cluster, _ in seen) == order  # turns of ``turn`` requests each
    assert len({id(task) for _, task in seen}) == 1
    await controller.shutdown(1)
    await runner


async def test_a_worker_whose_release_cancel_was_swallowed_takes_no_further_request() -> None:
    """A released cluster's reconcile that catches the cancellation ends its task; others go on elsewhere."""
    entered = asyncio.Event()
    tasks: dict[str, asyncio.Task[object] | None] = {}

    async def reconcile(request: mcr.Request) -> None:
        tasks[request.name] = asyncio.current_task()
        if request.cluster == "released":
            entered.set()
            # A reconciler that swallows its cancellation: it must not be handed more work.
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.Event().wait()

    controller, _channel = _controller(reconcile, total=1)
    controller.queue.add(mcr.Request("released", "ns", "r"))
    for index in range(3):
        controller.queue.add(mcr.Request("kept", "ns", f"k{index}"))
    runner = asyncio.create_task(controller.start())
    await entered.wait()
    await controller.release("released")
    await wait_until(lambda: len(tasks) == 4)
    assert tasks["k0"] is not tasks["r"]  # the kept cluster's requests ran in a task of their own
    assert tasks["r"] is not None and tasks["r"].done()
    await controller.shutdown(1)
    await runner


@pytest.mark.parametrize(
    ("turn", "first_slots"),
    [
        (1, {"a": 3, "b": 1, "c": 1}),  # turns of one: the two free slots go to b, then c
        (4, {"a": 3, "b": 2}),  # b came first: both free slots are its turn, c waits for the next
    ],
)
async def test_lane_width_and_global_bound_both_hold(turn: int, first_slots: dict[str, int]) -> None:
    running: Counter[str] = Counter()
    peak: Counter[str] = Counter()
    peak_total = 0
    gate = asyncio.Event()

    async def reconcile(request: mcr.Request) -> None:
        nonlocal peak_total
        running[request.cluster] += 1
        peak[request.cluster] = max(peak[request.cluster], running[request.cluster])
        peak_total = max(peak_total, sum(running.values()))
        await gate.wait()
        running[request.cluster] -= 1

    controller, channel = _controller(reconcile, lane=3, total=5, turn=turn)
    runner = asyncio.create_task(controller.start())
    for index in range(6):
        await channel.put(mcr.Request("a", "ns", str(index)))
    await wait_until(lambda: controller.active_workers == 3)  # "a" fills its lane of three, no more
    for cluster in ("b", "c"):
        for index in range(6):
            await channel.put(mcr.Request(cluster, "ns", str(index)))
    await wait_until(lambda: controller.active_workers == 5)  # the global bound: two slots left
    assert {cluster: count for cluster, count in running.items() if count} == first_slots
    gate.set()
    await wait_until(lambda: controller.stats.success == 18)
    assert peak_total == 5 and max(peak.values()) == 3
    await controller.shutdown(1)
    await runner


def test_bounds_below_one_are_refused_by_name() -> None:
    with pytest.raises(ValueError, match="max_total_reconciles must be at least 1, not 0"):
        mcr.Controller("bad", _noop, max_total_reconciles=0)
    with pytest.raises(ValueError, match="max_concurrent_reconciles must be at least 1, not 0"):
        mcr.Controller("bad", _noop, max_concurrent_reconciles=0)


async def _noop(_request: mcr.Request) -> None:
    return None


async def test_a_wrong_return_type_is_a_logged_retried_error_and_the_controller_recovers(
    caplog: pytest.LogCaptureFixture,
) -> None:
    calls: Counter[mcr.Request] = Counter()

    async def sloppy(request: mcr.Request) -> mcr.Result | None:
        calls[request] += 1
        if calls[request] <= 3:
            return True  # type: ignore[return-value]  # the bug under test
        return None

    controller, channel = _controller(sloppy)
    runner = asyncio.create_task(controller.start())
    first = mcr.Request("east", "ns", "sloppy")
    with caplog.at_level(logging.ERROR, logger="mcruntime.controller"):
        await channel.put(first)
        await wait_until(lambda: controller.stats.success == 1)
    assert calls[first] == 4
    assert controller.stats.error == 3
    assert "returned a bool; expected Result or None" in caplog.text
    assert "east:ns/sloppy" in caplog.text
    assert controller.queue.num_requeues(first) == 0  # forgotten after it recovered
    # The controller still works: a fresh request is reconciled too.
    second = mcr.Request("east", "ns", "after")
    await channel.put(second)
    await wait_until(lambda: controller.stats.success == 2)
    await controller.shutdown(1)
    await runner


async def test_a_failing_observer_costs_nothing_but_a_log_line(caplog: pytest.LogCaptureFixture) -> None:
    controller, channel = _controller(_noop)

    def broken(*_args: object) -> None:
        raise RuntimeError("observer bug")

    controller.observers.append(broken)
    runner = asyncio.create_task(controller.start())
    with caplog.at_level(logging.ERROR, logger="mcruntime.controller"):
        for index in range(3):
            await channel.put(mcr.Request("east", "ns", str(index)))
        await wait_until(lambda: controller.stats.success == 3)
    assert "observer" in caplog.text and "observer bug" in caplog.text
    assert controller.queue.processing_count == 0
    await controller.shutdown(1)
    await runner


async def test_a_dispatcher_that_dies_is_logged_and_restarted(caplog: pytest.LogCaptureFixture) -> None:
    class FlakyGate:
        """Raises once, on its second call (the dispatcher's), the way a buggy sharding gate would."""

        def __init__(self) -> None:
            self.calls = 0

        def admits(self, cluster: str) -> bool:
            self.calls += 1
            if self.calls == 2:
                raise RuntimeError("gate bug")
            return True

    controller, channel = _controller(_noop)
    controller.dispatcher_backoff = mcr.Backoff(base=0.01, cap=0.01)
    controller.gate = FlakyGate()
    runner = asyncio.create_task(controller.start())
    request = mcr.Request("east", "ns", "x")
    with caplog.at_level(logging.ERROR):
        await channel.put(request)
        await wait_until(lambda: controller.stats.success == 1, timeout=10)
    (status,) = [loop for loop in controller.tasks.loops() if loop.name == "dispatcher"]
    assert status.crashes == 1 and status.last_error == "RuntimeError: gate bug"
    assert "loop dispatcher died" in caplog.text and "gate bug" in caplog.text
    await controller.shutdown(1)
    await runner
