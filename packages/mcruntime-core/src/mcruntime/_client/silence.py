"""One read-timeout timer per HTTP/2 connection, sweeping its watch streams.

A watch is silent when its reader has waited a whole read timeout for the
next event. With a timer per stream, a replica watching 10,000 clusters
kept 10,000 timers in the event loop's heap, each moved on every time a
bookmark arrived, and every other timer in the process paid the heap's
depth: about a fifth of the idle loop's Python at that size. Here each
connection keeps one timer. It fires at the earliest deadline of a waiting
stream, but not more often than a quarter of the shortest read timeout, so
a silent stream is failed between its timeout and a quarter after it, and
the cost is one pass over a connection's streams a few times per timeout.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable, Iterable

Check = Callable[[float], "tuple[float, float] | None"]
"""A stream's check: given the loop's time, its wait's ``(deadline, timeout)``, or ``None``."""

SLACK = 0.25
"""How late, as a share of its read timeout, a silent stream may be found."""


class Sweep:
    """The read-timeout timer of one connection; ``streams`` yields each open stream's check.

    A check takes the loop's time and returns ``(deadline, timeout)`` of a
    wait still within its timeout, ``None`` when the stream is not waiting
    (or its wait was just failed as silent).
    """

    __slots__ = ("_at", "_streams", "_timer")

    def __init__(self, streams: Callable[[], Iterable[Check]]) -> None:
        self._streams = streams
        self._timer: asyncio.TimerHandle | None = None
        self._at = math.inf

    @property
    def armed_at(self) -> float | None:
        """When the sweep runs next (the loop's clock), ``None`` when nobody waits."""
        return self._at if self._timer is not None else None

    def waiting(self, deadline: float, timeout: float) -> None:
        """A stream waits until ``deadline``: make sure a sweep comes by its slack after it."""
        if deadline + timeout * SLACK < self._at:
            self._arm(deadline)

    def stop(self) -> None:
        """The connection is gone: no sweep runs again."""
        if self._timer is not None:
            self._timer.cancel()
        self._timer = None
        self._at = math.inf

    def _arm(self, at: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._at = at
        self._timer = asyncio.get_running_loop().call_at(at, self.run)

    def run(self) -> None:
        """Fail every wait that lasted its timeout; come back for the next deadline, or when needed."""
        self._timer = None
        self._at = math.inf
        now = asyncio.get_running_loop().time()
        earliest = shortest = math.inf
        for check in self._streams():
            pending = check(now)
            if pending is None:
                continue
            deadline, timeout = pending
            earliest = min(earliest, deadline)
            shortest = min(shortest, timeout)
        if earliest < math.inf:
            self._arm(max(earliest, now + shortest * SLACK))
