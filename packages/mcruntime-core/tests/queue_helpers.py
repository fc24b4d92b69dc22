"""Fakes shared by the work queue and rate limiter tests."""

from __future__ import annotations

import asyncio
from collections.abc import Hashable, Iterator, MutableMapping, Sequence
from typing import Any

from mcruntime._control.workqueue import WorkQueue


class FakeClock:
    """A clock that moves only when the test says so."""

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class FixedDelay:
    """A rate limiter that always answers the same delay and counts its calls per item."""

    def __init__(self, delay: float) -> None:
        self.delay = delay
        self.calls: dict[Hashable, int] = {}

    def when(self, item: Hashable) -> float:
        self.calls[item] = self.calls.get(item, 0) + 1
        return self.delay

    def forget(self, item: Hashable) -> None:
        self.calls.pop(item, None)

    def retries(self, item: Hashable) -> int:
        return self.calls.get(item, 0)


async def play(
    queue: WorkQueue[Any],
    steps: Sequence[tuple[str, object]],
    adds: MutableMapping[Any, int],
    last_added: dict[Any, int],
    ticks: Iterator[int],
) -> None:
    """Apply hypothesis-drawn steps to ``queue``: ``("add", key)`` or ``("yield", n)``; then shut it down.

    Records how often each key was added and at which tick it was last added,
    for the property checks that follow.
    """
    for operation, argument in steps:
        if operation == "add":
            queue.add(argument)
            adds[argument] += 1
            last_added[argument] = next(ticks)
        else:
            assert isinstance(argument, int)
            for _ in range(argument):
                await asyncio.sleep(0)
    queue.shut_down()
