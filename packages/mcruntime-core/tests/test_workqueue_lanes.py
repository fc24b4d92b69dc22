"""Per-group lanes in the work queue: a group at its limit sits out, the others keep their turns."""

from __future__ import annotations

import asyncio
import itertools
from collections import Counter, defaultdict
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from queue_helpers import play

from mcruntime._control.workqueue import QueueShutDown, WorkQueue


@dataclass(frozen=True, order=True)
class Key:
    cluster: str
    name: str


async def _take(queue: WorkQueue[Key], timeout: float = 1.0) -> Key:
    async with asyncio.timeout(timeout):
        return await queue.get()


def test_a_limit_below_one_is_refused_with_its_value() -> None:
    with pytest.raises(ValueError, match=r"group_limit must be at least 1 \(or None\), not 0"):
        WorkQueue[Key](group_limit=0)


async def test_a_group_at_its_limit_is_passed_over_until_one_of_its_keys_is_done() -> None:
    queue = WorkQueue[Key](group_limit=1)
    for name in ("a1", "a2", "a3"):
        queue.add(Key("hung", name))
    queue.add(Key("ok", "b1"))
    queue.add(Key("ok", "b2"))

    first = await _take(queue)
    assert first == Key("hung", "a1")
    # "hung" holds its one slot: every other get goes to "ok", however many "hung" keys wait.
    assert await _take(queue) == Key("ok", "b1")
    queue.done(Key("ok", "b1"))
    assert await _take(queue) == Key("ok", "b2")
    queue.done(Key("ok", "b2"))
    assert queue.depth_by_group() == {"hung": 2}
    assert queue.processing_by_group() == {"hung": 1}
    waiting = asyncio.ensure_future(queue.get())
    await asyncio.sleep(0)
    assert not waiting.done(), "a parked group's key was handed out"
    queue.done(first)
    assert await asyncio.wait_for(waiting, 1) == Key("hung", "a2")


async def test_other_groups_keep_round_robin_while_one_is_parked() -> None:
    queue = WorkQueue[Key](group_limit=2)
    for index in range(4):
        for cluster in ("a", "b", "c"):
            queue.add(Key(cluster, str(index)))
    taken = [await _take(queue) for _ in range(6)]
    # Two turns each, in order: a, b, c, a, b, c.
    assert [key.cluster for key in taken] == ["a", "b", "c"] * 2
    # Everyone is at the limit now; finishing a "b" key lets only "b" go on.
    queue.done(Key("b", "0"))
    assert await _take(queue) == Key("b", "2")
    # "a" and "c" finish one each: they rejoin behind in the order they were freed.
    queue.done(Key("c", "0"))
    queue.done(Key("a", "0"))
    assert [await _take(queue) for _ in range(2)] == [Key("c", "2"), Key("a", "2")]


async def test_a_held_key_added_again_waits_for_its_lane() -> None:
    queue = WorkQueue[Key](group_limit=1)
    queue.add(Key("a", "x"))
    held = await _take(queue)
    queue.add(held)  # re-added while processing: becomes ready at done, and the lane is free then
    queue.add(Key("a", "y"))
    queue.done(held)
    assert queue.processing_by_group() == {}
    # "y" waited in line first; "x" rejoined behind it. The lane still admits one at a time.
    assert await _take(queue) == Key("a", "y")
    assert queue.processing_by_group() == {"a": 1}
    assert queue.depth_by_group() == {"a": 1}
    queue.done(Key("a", "y"))
    assert await _take(queue) == Key("a", "x")


async def test_purging_a_parked_group_drops_its_waiting_keys() -> None:
    queue = WorkQueue[Key](group_limit=1)
    queue.add(Key("gone", "1"))
    queue.add(Key("gone", "2"))
    queue.add(Key("stays", "1"))
    held = await _take(queue)
    assert held.cluster == "gone"
    assert queue.purge("gone") == 1
    assert await _take(queue) == Key("stays", "1")
    queue.done(held)
    queue.done(Key("stays", "1"))
    assert (len(queue), queue.processing_count, queue.depth_by_group()) == (0, 0, {})


async def test_after_shutdown_a_parked_key_is_still_handed_out_once_its_lane_frees() -> None:
    queue = WorkQueue[Key](group_limit=1)
    queue.add(Key("a", "1"))
    queue.add(Key("a", "2"))
    held = await _take(queue)
    queue.shut_down()
    waiting = asyncio.ensure_future(queue.get())
    await asyncio.sleep(0)
    assert not waiting.done()
    queue.done(held)
    assert await asyncio.wait_for(waiting, 1) == Key("a", "2")
    queue.done(Key("a", "2"))
    with pytest.raises(QueueShutDown):
        await _take(queue)


# -- property: concurrent workers under lanes ------------------------------------------------

keys = st.builds(Key, st.sampled_from(["a", "b", "c"]), st.sampled_from(["1", "2", "3", "4"]))
steps_strategy = st.lists(
    st.one_of(
        st.tuples(st.just("add"), keys),
        st.tuples(st.just("yield"), st.integers(min_value=1, max_value=3)),
    ),
    max_size=60,
)


async def _run(steps: list[tuple[str, object]], workers: int, limit: int, slow: dict[str, int]) -> None:
    queue = WorkQueue[Key](group_limit=limit)
    ticks = itertools.count()
    last_added: dict[Key, int] = {}
    adds: Counter[Key] = Counter()
    starts: dict[Key, list[int]] = defaultdict(list)
    in_flight: set[Key] = set()
    per_group: Counter[str] = Counter()
    violations: list[str] = []

    async def worker() -> None:
        while True:
            try:
                key = await queue.get()
            except QueueShutDown:
                return
            if key in in_flight:
                violations.append(f"{key} on two workers")
            per_group[key.cluster] += 1
            if per_group[key.cluster] > limit:
                violations.append(f"{key.cluster} over its limit")
            in_flight.add(key)
            starts[key].append(next(ticks))
            for _ in range(slow.get(key.cluster, 0)):
                await asyncio.sleep(0)
            in_flight.discard(key)
            per_group[key.cluster] -= 1
            queue.done(key)

    tasks = [asyncio.create_task(worker()) for _ in range(workers)]
    await play(queue, steps, adds, last_added, ticks)
    async with asyncio.timeout(5):
        await asyncio.gather(*tasks)

    assert violations == []
    for key, added_at in last_added.items():
        assert starts[key], f"{key} was added but never processed"
        assert max(starts[key]) > added_at, f"{key} was added during processing and not processed again"
        assert len(starts[key]) <= adds[key], f"{key} was processed more often than added"
    assert (len(queue), queue.processing_count, queue.processing_by_group()) == (0, 0, {})


@settings(max_examples=80, deadline=None)
@given(
    steps=steps_strategy,
    workers=st.integers(min_value=1, max_value=5),
    limit=st.integers(min_value=1, max_value=3),
    slow=st.dictionaries(st.sampled_from(["a", "b", "c"]), st.integers(min_value=0, max_value=6)),
)
def test_lanes_never_exceed_their_limit_share_a_key_or_miss_an_add(
    steps: list[tuple[str, object]], workers: int, limit: int, slow: dict[str, int]
) -> None:
    asyncio.run(_run(steps, workers, limit, slow))


async def test_a_group_that_never_finishes_costs_the_others_no_gets() -> None:
    queue = WorkQueue[Key](group_limit=1)
    queue.add(Key("hung", "0"))
    stuck = await _take(queue)  # never done: the hung cluster's one reconcile
    for index in range(1, 50):
        queue.add(Key("hung", str(index)))
    served = []
    for index in range(100):
        queue.add(Key("ok", str(index)))
        key = await _take(queue)
        served.append(key)
        queue.done(key)
    assert all(key.cluster == "ok" for key in served)
    assert queue.depth_by_group() == {"hung": 49}
    assert queue.processing_by_group() == {"hung": 1}
    queue.done(stuck)
