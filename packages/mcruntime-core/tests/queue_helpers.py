"""Fakes shared by the work queue and rate limiter tests."""

from __future__ import annotations

from collections.abc import Hashable


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
