"""Turns of several keys: a group is handed up to ``keys_per_turn`` keys in a row, and no more."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import pytest

from mcruntime._control.workqueue import WorkQueue


@dataclass(frozen=True)
class Key:
    cluster: str
    name: str


def _fill(queue: WorkQueue[Key], clusters: str, count: int) -> None:
    for index in range(count):
        for cluster in clusters:
            queue.add(Key(cluster, str(index)))


def _drain(queue: WorkQueue[Key]) -> list[str]:
    """Take every ready key one at a time, finishing each before the next: the order of clusters."""
    order = []
    while (key := queue.get_nowait()) is not None:
        order.append(key.cluster)
        queue.done(key)
    return order


def test_a_turn_below_one_is_refused_with_its_value() -> None:
    with pytest.raises(ValueError, match="keys_per_turn must be at least 1, not 0"):
        WorkQueue[Key](keys_per_turn=0)


def test_one_key_per_turn_by_default() -> None:
    queue = WorkQueue[Key]()
    _fill(queue, "abc", 2)
    assert queue.keys_per_turn == 1
    assert _drain(queue) == list("abcabc")


def test_each_group_is_handed_up_to_its_turn_in_a_row_then_the_next_goes() -> None:
    queue = WorkQueue[Key](keys_per_turn=4)
    _fill(queue, "abc", 10)
    assert "".join(_drain(queue)) == "aaaabbbbcccc" * 2 + "aabbcc"


def test_a_turn_ends_when_the_groups_line_is_empty_and_a_later_key_waits_at_the_back() -> None:
    queue = WorkQueue[Key](keys_per_turn=5)
    _fill(queue, "ab", 2)
    taken = [queue.get_nowait() for _ in range(2)]
    assert [key.cluster for key in taken if key] == ["a", "a"]
    queue.add(Key("a", "late"))  # "a"'s turn ended with its line: the new key queues behind "b"
    for key in taken:
        assert key is not None
        queue.done(key)
    assert "".join(_drain(queue)) == "bba"


def test_a_group_at_its_limit_mid_turn_resumes_its_turn_at_the_front_when_a_key_is_done() -> None:
    queue = WorkQueue[Key](group_limit=1, keys_per_turn=3)
    _fill(queue, "ab", 4)
    first = queue.get_nowait()
    assert first == Key("a", "0")
    second = queue.get_nowait()  # "a" is at its limit: "b" is served meanwhile
    assert second == Key("b", "0")
    assert queue.get_nowait() is None  # both lanes are full
    queue.done(first)
    # "a" had two keys of its turn left: it goes on with them, ahead of "b"'s unfinished turn.
    third = queue.get_nowait()
    assert third == Key("a", "1")
    queue.done(second)
    queue.done(third)  # the last freed goes first: "a" with one key of its turn left, then "b" with two
    assert "".join(_drain(queue)) == "abbab"


def test_no_group_waits_more_than_a_turn_per_group_ahead_of_it() -> None:
    queue = WorkQueue[Key](keys_per_turn=8)
    for index in range(100):
        queue.add(Key("big", str(index)))
        queue.add(Key("other", str(index)))
    queue.add(Key("small", "0"))
    order = _drain(queue)
    assert order.index("small") <= 2 * 8


def test_a_purged_group_loses_its_unfinished_turn() -> None:
    queue = WorkQueue[Key](group_limit=1, keys_per_turn=4)
    _fill(queue, "ab", 3)
    held = queue.get_nowait()
    assert held == Key("a", "0")
    assert queue.purge("a") == 2
    queue.add(Key("a", "new"))
    queue.done(held)  # a purged key's done neither requeues it nor resumes the old turn
    assert "".join(_drain(queue)) == "bbba"


async def test_a_waiting_worker_is_woken_for_a_resumed_turn() -> None:
    queue = WorkQueue[Key](group_limit=1, keys_per_turn=2)
    _fill(queue, "a", 2)
    held = await queue.get()
    waiting = asyncio.ensure_future(queue.get())
    await asyncio.sleep(0)
    assert not waiting.done()
    queue.done(held)
    async with asyncio.timeout(1):
        assert await waiting == Key("a", "1")
