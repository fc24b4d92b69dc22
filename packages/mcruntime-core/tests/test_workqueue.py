"""The work queue: dedup, one worker per key, re-processing, fairness, delays, purge, shutdown."""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import TypeVar

import pytest
from queue_helpers import FakeClock, FixedDelay

from mcruntime._control.ratelimit import ExponentialBackoff
from mcruntime._control.workqueue import NoMetrics, QueueMetrics, QueueShutDown, WorkQueue

# -- helpers ----------------------------------------------------------------------------

K = TypeVar("K", bound=Hashable)


@dataclass(frozen=True, order=True)
class Request:
    """A reconcile request as controllers will queue it: the cluster is the group."""

    cluster: str
    name: str


class RecordingMetrics:
    """Keeps every metrics event in order."""

    def __init__(self) -> None:
        self.events: list[tuple[object, ...]] = []

    def on_add(self, key: Hashable, group: Hashable) -> None:
        self.events.append(("add", key, group))

    def on_get(self, key: Hashable, group: Hashable, waited: float) -> None:
        self.events.append(("get", key, group, waited))

    def on_done(self, key: Hashable, group: Hashable, processing: float) -> None:
        self.events.append(("done", key, group, processing))

    def on_retry(self, key: Hashable, group: Hashable) -> None:
        self.events.append(("retry", key, group))


async def take(queue: WorkQueue[K], timeout: float = 2.0) -> K:
    """Get a key and finish it at once, failing the test if none comes within ``timeout``."""
    async with asyncio.timeout(timeout):
        key = await queue.get()
    queue.done(key)
    return key


async def let_other_tasks_run() -> None:
    """One pass of the event loop: tasks created before this call run up to their first wait."""
    await asyncio.sleep(0)


@pytest.fixture
async def timers(monkeypatch: pytest.MonkeyPatch) -> list[asyncio.TimerHandle]:
    """Every timer handle scheduled on the test's loop while the test runs."""
    loop = asyncio.get_running_loop()
    handles: list[asyncio.TimerHandle] = []
    schedule = loop.call_at

    def recording_call_at(
        when: float,
        callback: Callable[..., object],
        *args: object,
        context: contextvars.Context | None = None,
    ) -> asyncio.TimerHandle:
        handle = schedule(when, callback, *args, context=context)
        handles.append(handle)
        return handle

    monkeypatch.setattr(loop, "call_at", recording_call_at)
    return handles


# -- dedup and one worker per key ---------------------------------------------------------


async def test_a_key_added_twice_is_handed_out_once() -> None:
    queue = WorkQueue[str]()
    for key in ["a", "b", "a", "a", "b"]:
        queue.add(key)
    assert len(queue) == 2
    assert [await take(queue), await take(queue)] == ["a", "b"]
    assert len(queue) == 0


async def test_a_key_added_while_processing_waits_for_done_then_runs_again() -> None:
    queue = WorkQueue[str]()
    queue.add("a")
    held = await queue.get()
    queue.add("a")
    queue.add("a")
    assert len(queue) == 0  # held back: no second worker may take it
    assert queue.processing_count == 1
    queue.done(held)
    assert len(queue) == 1
    assert await take(queue) == "a"
    assert (len(queue), queue.processing_count) == (0, 0)


async def test_done_needs_a_held_key() -> None:
    queue = WorkQueue[str]()
    with pytest.raises(ValueError, match="no worker holds"):
        queue.done("never taken")
    queue.add("a")
    queue.done(await queue.get())
    with pytest.raises(ValueError, match="no worker holds"):
        queue.done("a")


async def test_get_nowait_hands_out_what_get_would_or_nothing() -> None:
    queue = WorkQueue[str](group=lambda key: key.split("/")[0], group_limit=1)
    assert queue.get_nowait() is None  # nothing ready: no waiting, no key
    for key in ["a/1", "a/2", "b/1"]:
        queue.add(key)
    first = queue.get_nowait()
    assert first == "a/1" and queue.processing_count == 1
    assert queue.get_nowait() == "b/1"  # a's lane is full: b's turn
    assert queue.get_nowait() is None  # a/2 waits for a/1's done
    queue.done("a/1")
    assert queue.get_nowait() == "a/2"
    queue.done("a/2")
    queue.done("b/1")
    assert (len(queue), queue.processing_count) == (0, 0)


# -- fairness between groups ----------------------------------------------------------------


async def test_keys_are_grouped_by_their_cluster_by_default() -> None:
    queue = WorkQueue[object]()
    for key in [Request("east", "a"), Request("east", "b"), Request("west", "a"), "plain", 7]:
        queue.add(key)
    assert queue.depth_by_group() == {"east": 2, "west": 1, "": 2}


async def test_groups_take_turns_and_each_group_is_first_in_first_out() -> None:
    queue = WorkQueue[str](group=lambda key: key.split("/")[0])
    for key in ["a/1", "a/2", "a/3", "a/4", "b/1", "b/2", "c/1"]:
        queue.add(key)
    assert [await take(queue) for _ in range(7)] == ["a/1", "b/1", "c/1", "a/2", "b/2", "a/3", "a/4"]


async def test_a_small_cluster_is_served_long_before_a_big_cluster_drains() -> None:
    queue = WorkQueue[Request]()
    for n in range(2000):
        queue.add(Request("big", f"object-{n}"))
    for n in range(10):
        queue.add(Request("small", f"object-{n}"))
    small_done = 0
    big_depth_when_small_finished: int | None = None

    async def worker() -> None:
        nonlocal small_done, big_depth_when_small_finished
        while len(queue):
            key = await queue.get()
            queue.done(key)
            if key.cluster == "small":
                small_done += 1
                if small_done == 10:
                    big_depth_when_small_finished = queue.depth_by_group()["big"]

    async with asyncio.timeout(10):
        await worker()
    assert small_done == 10
    assert big_depth_when_small_finished is not None
    assert big_depth_when_small_finished > 1000  # the big queue is not even half drained
    assert big_depth_when_small_finished >= 2000 - 10  # turn by turn: one big key per small key


# -- delays and rate limiting ----------------------------------------------------------------


async def test_delayed_keys_arrive_in_the_order_they_are_due() -> None:
    queue = WorkQueue[str]()
    queue.add_after("late", 0.03)
    queue.add_after("early", 0.01)
    queue.add("now")
    assert (len(queue), queue.delayed_count) == (1, 2)
    assert [await take(queue) for _ in range(3)] == ["now", "early", "late"]
    assert queue.delayed_count == 0


async def test_add_after_keeps_the_earlier_of_two_times(timers: list[asyncio.TimerHandle]) -> None:
    queue = WorkQueue[str]()
    queue.add_after("moved up", 60.0)
    queue.add_after("moved up", 0.01)
    queue.add_after("kept", 0.01)
    queue.add_after("kept", 60.0)  # later than pending: ignored
    assert queue.delayed_count == 2
    scheduled = list(timers)
    assert len(scheduled) == 3  # "kept" was not rescheduled
    assert scheduled[0].cancelled()  # the 60 s timer of "moved up"
    assert sorted([await take(queue), await take(queue)]) == ["kept", "moved up"]
    assert queue.delayed_count == 0  # no 60 s timer left behind for either key


def test_add_after_without_a_positive_delay_adds_at_once() -> None:
    queue = WorkQueue[str]()  # no event loop needed: nothing is scheduled
    queue.add_after("zero", 0.0)
    queue.add_after("negative", -5.0)
    assert (len(queue), queue.delayed_count) == (2, 0)


async def test_a_key_ready_now_can_also_be_due_later() -> None:
    queue = WorkQueue[str]()
    queue.add_after("a", 0.01)
    queue.add("a")
    assert await take(queue) == "a"
    assert await take(queue) == "a"  # the delayed add still happens after the first run


async def test_rate_limited_adds_count_retries_until_forgotten() -> None:
    queue = WorkQueue[str](rate_limiter=ExponentialBackoff(base=0.001, cap=0.004))
    for _ in range(3):
        queue.add_rate_limited("flaky")
    assert queue.num_requeues("flaky") == 3
    assert queue.delayed_count == 1  # one pending retry, at the earliest time
    assert await take(queue) == "flaky"
    queue.forget("flaky")
    assert queue.num_requeues("flaky") == 0


async def test_a_zero_rate_limit_delay_adds_at_once() -> None:
    limiter = FixedDelay(0.0)
    queue = WorkQueue[str](rate_limiter=limiter)
    queue.add_rate_limited("a")
    assert (len(queue), queue.delayed_count) == (1, 0)
    assert limiter.calls == {"a": 1}


# -- purge -----------------------------------------------------------------------------------


async def test_purge_drops_a_group_and_forgets_its_backoff(timers: list[asyncio.TimerHandle]) -> None:
    queue = WorkQueue[Request](rate_limiter=ExponentialBackoff(base=30.0, cap=60.0))
    held = Request("gone", "held")
    queue.add(held)
    assert await queue.get() == held
    queue.add(Request("gone", "ready-1"))
    queue.add(Request("gone", "ready-2"))
    queue.add(Request("stays", "ready"))
    queue.add_rate_limited(Request("gone", "retrying"))
    queue.add_rate_limited(Request("stays", "retrying"))
    queue.add(held)  # added again while held: would run again after done
    retry_timers = list(timers)

    assert queue.purge("gone") == 3  # two ready, one delayed

    assert queue.depth_by_group() == {"stays": 1}
    assert queue.delayed_count == 1
    assert retry_timers[0].cancelled()
    assert not retry_timers[1].cancelled()
    assert queue.num_requeues(Request("gone", "retrying")) == 0
    assert queue.num_requeues(Request("stays", "retrying")) == 1
    queue.add_rate_limited(held)  # the old engagement's retry of a held key: dropped
    assert queue.num_requeues(held) == 0
    queue.done(held)
    assert len(queue) == 1  # the held key did not come back
    assert await take(queue) == Request("stays", "ready")

    queue.add(held)  # once done, the key is an ordinary key again
    queue.add(Request("gone", "new"))
    assert queue.depth_by_group() == {"gone": 2}
    queue.shut_down()


async def test_a_held_key_added_after_its_group_was_purged_is_handed_out_once_done() -> None:
    # Found by a review: a cluster replaced (or gone and back) while a reconcile of one of its
    # keys ran lost that key: the new engagement's add was ignored as the old one's retry, and
    # the object waited for its next change.
    queue = WorkQueue[Request](rate_limiter=ExponentialBackoff(base=30.0, cap=60.0))
    held = Request("back", "held")
    queue.add(held)
    assert await queue.get() == held
    queue.purge("back")
    queue.add(held)  # the new engagement's informer lists it
    queue.add_rate_limited(held)  # the old reconcile's error: its backoff is not the new one's
    assert len(queue) == 0 and queue.delayed_count == 0
    queue.done(held)
    assert await take(queue) == held  # taken and done: once
    assert len(queue) == 0
    queue.shut_down()


def test_purging_an_unknown_group_drops_nothing() -> None:
    queue = WorkQueue[Request]()
    queue.add(Request("east", "a"))
    assert queue.purge("west") == 0
    assert queue.depth_by_group() == {"east": 1}


# -- shutdown --------------------------------------------------------------------------------


async def test_after_shutdown_ready_keys_are_handed_out_then_get_raises() -> None:
    limiter = FixedDelay(0.0)
    queue = WorkQueue[str](rate_limiter=limiter)
    queue.add("before")
    queue.shut_down()
    queue.add("after")
    queue.add_after("after", 0.01)
    queue.add_rate_limited("after")
    assert (len(queue), queue.delayed_count, limiter.calls) == (1, 0, {})
    assert queue.shutting_down
    assert await take(queue) == "before"
    with pytest.raises(QueueShutDown):
        await queue.get()


async def test_shutdown_wakes_idle_getters_with_queue_shut_down() -> None:
    queue = WorkQueue[str]()
    getters = [asyncio.create_task(queue.get()) for _ in range(3)]
    await let_other_tasks_run()
    assert not any(getter.done() for getter in getters)  # all parked in get()
    queue.shut_down()
    async with asyncio.timeout(2):
        results = await asyncio.gather(*getters, return_exceptions=True)
    assert all(isinstance(result, QueueShutDown) for result in results)


async def test_a_held_key_added_again_runs_after_shutdown() -> None:
    queue = WorkQueue[str]()
    queue.add("a")
    held = await queue.get()
    queue.add("a")
    queue.shut_down()
    queue.done(held)
    assert await take(queue) == "a"
    with pytest.raises(QueueShutDown):
        await queue.get()


async def test_drain_gives_up_at_the_deadline_while_a_key_is_held() -> None:
    queue = WorkQueue[str]()
    queue.add("stuck")
    held = await queue.get()
    assert await queue.shut_down_with_drain(timeout=0.02) is False
    assert queue.processing_count == 1
    queue.done(held)
    assert await queue.shut_down_with_drain(timeout=0) is True


async def test_drain_returns_when_the_last_held_key_is_done() -> None:
    queue = WorkQueue[str]()
    queue.add("a")
    queue.add("b")
    first, second = await queue.get(), await queue.get()
    drain = asyncio.create_task(queue.shut_down_with_drain(timeout=30))
    await let_other_tasks_run()
    assert queue.shutting_down
    assert not drain.done()
    queue.done(first)
    await let_other_tasks_run()
    assert not drain.done()  # one key is still held
    queue.done(second)
    async with asyncio.timeout(2):
        assert await drain is True


async def test_shutdown_leaves_no_task_and_no_live_timer(timers: list[asyncio.TimerHandle]) -> None:
    tasks_before = asyncio.all_tasks()
    queue = WorkQueue[Request]()
    processed: list[Request] = []
    all_processed = asyncio.Event()

    async def worker() -> None:
        while True:
            try:
                key = await queue.get()
            except QueueShutDown:
                return
            processed.append(key)
            queue.done(key)
            if len(processed) == 3:
                all_processed.set()

    workers = [asyncio.create_task(worker()) for _ in range(3)]
    for n in range(3):
        queue.add(Request("east", f"object-{n}"))
    async with asyncio.timeout(2):
        await all_processed.wait()  # the workers are now parked in get()
    scheduled_before = len(timers)
    for n in range(5):
        queue.add_after(Request("west", f"later-{n}"), 60.0 + n)
    queue_timers = timers[scheduled_before:]
    assert len(queue_timers) == 5

    queue.shut_down()

    async with asyncio.timeout(2):
        await asyncio.gather(*workers)
    assert all(timer.cancelled() for timer in queue_timers)
    assert queue.delayed_count == 0
    assert asyncio.all_tasks() == tasks_before
    assert len(processed) == 3


# -- getters ---------------------------------------------------------------------------------


async def test_a_getter_cancelled_after_being_woken_passes_the_key_on() -> None:
    queue = WorkQueue[str]()
    first = asyncio.create_task(queue.get())
    second = asyncio.create_task(queue.get())
    await let_other_tasks_run()
    queue.add("a")  # wakes the first getter...
    first.cancel()  # ...which is cancelled before it can take the key
    async with asyncio.timeout(2):
        assert await second == "a"
    assert first.cancelled()
    queue.done("a")


async def test_a_getter_ahead_is_served_before_those_that_waited_longer() -> None:
    queue = WorkQueue[str]()
    early = asyncio.create_task(queue.get())
    await let_other_tasks_run()
    ahead = asyncio.create_task(queue.get(ahead=True))
    await let_other_tasks_run()
    queue.add("a")
    async with asyncio.timeout(2):
        assert await ahead == "a"
    assert not early.done()
    queue.add("b")
    async with asyncio.timeout(2):
        assert await early == "b"
    queue.done("a")
    queue.done("b")


async def test_a_cancelled_getter_does_not_swallow_a_later_key() -> None:
    queue = WorkQueue[str]()
    cancelled = asyncio.create_task(queue.get())
    await let_other_tasks_run()
    cancelled.cancel()
    await let_other_tasks_run()
    assert cancelled.cancelled()
    queue.add("a")
    assert await take(queue) == "a"


# -- metrics ---------------------------------------------------------------------------------


async def test_metrics_see_adds_waits_processing_and_retries() -> None:
    clock = FakeClock(500.0)
    recorder = RecordingMetrics()
    metrics: QueueMetrics = recorder
    queue = WorkQueue[Request](metrics=metrics, clock=clock, rate_limiter=FixedDelay(0.0))
    key = Request("east", "a")
    queue.add(key)
    queue.add(key)  # deduplicated: not reported
    clock.advance(2.0)
    assert await queue.get() == key
    clock.advance(3.0)
    assert queue.longest_processing_seconds() == 3.0
    queue.done(key)
    assert queue.longest_processing_seconds() == 0.0
    queue.add_rate_limited(key)
    assert recorder.events == [
        ("add", key, "east"),
        ("get", key, "east", 2.0),
        ("done", key, "east", 3.0),
        ("retry", key, "east"),
        ("add", key, "east"),
    ]


async def test_longest_processing_is_the_oldest_held_key() -> None:
    clock = FakeClock(500.0)
    queue = WorkQueue[str](clock=clock)
    for key in ["a", "b", "c"]:
        queue.add(key)
    a = await queue.get()
    clock.advance(10.0)
    b = await queue.get()
    clock.advance(5.0)
    assert queue.longest_processing_seconds() == 15.0
    queue.done(a)
    assert queue.longest_processing_seconds() == 5.0
    queue.done(b)


def test_no_metrics_accepts_every_event() -> None:
    metrics: QueueMetrics = NoMetrics()
    metrics.on_add("k", "g")
    metrics.on_get("k", "g", 1.0)
    metrics.on_done("k", "g", 1.0)
    metrics.on_retry("k", "g")
    assert WorkQueue[str](metrics=metrics).processing_count == 0
