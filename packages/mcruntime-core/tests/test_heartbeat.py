"""The heartbeat thread: it beats while the main loop is busy, and stops when the loop stops turning.

Pure logic: the beat counts instead of writing a Lease, and the "connection"
is a context manager that records it was opened and closed. The main loop is
blocked on purpose with ``time.sleep``: that block is the fault under test,
not a stand-in for waiting on a condition.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import AsyncIterator
from typing import Any

from mcruntime._coordination.heartbeat import Heartbeat
from mcruntime.testing import wait_until


class Beats:
    """Counts beats (from the heartbeat's thread) and the connection's life."""

    def __init__(self, *, die_after: int | None = None) -> None:
        self.count = 0
        self.threads: set[str] = set()
        self.opened = 0
        self.closed = 0
        self.die_after = die_after
        self._lock = threading.Lock()

    @contextlib.asynccontextmanager
    async def connect(self) -> AsyncIterator[Any]:
        self.opened += 1
        try:
            yield object()
        finally:
            self.closed += 1

    async def beat(self, _client: Any) -> float:
        with self._lock:
            self.count += 1
            self.threads.add(threading.current_thread().name)
            if self.die_after is not None and self.count == self.die_after:
                raise SystemExit("the beat kills its thread")  # not an Exception: the thread dies
        return 0.05


def block_the_loop(seconds: float) -> None:
    """Hold the main thread (and so its event loop) without yielding: the fault under test."""
    time.sleep(seconds)


def heartbeat(beats: Beats, stall_limit: float = 30.0) -> Heartbeat:
    return Heartbeat("test", beats.connect, beats.beat, stall_limit=stall_limit, idle=0.05)


async def test_it_beats_on_its_own_thread_while_the_main_loop_is_blocked() -> None:
    beats = Beats()
    pulse = heartbeat(beats)
    pulse.start()
    try:
        await wait_until(lambda: beats.count >= 2, timeout=10)
        before = beats.count
        block_the_loop(1.0)
        during = beats.count - before
        assert during >= 5, during  # 20 beats are due in that second; the GIL hands the thread its turns
        assert threading.current_thread().name not in beats.threads
        assert beats.threads == {"mcruntime test"}
    finally:
        await pulse.stop()
    assert not pulse.running
    assert beats.opened == beats.closed == 1


async def test_it_stops_beating_once_the_main_loop_has_not_ticked_for_the_stall_limit() -> None:
    beats = Beats()
    pulse = heartbeat(beats, stall_limit=0.5)
    pulse.start()
    try:
        await wait_until(lambda: beats.count >= 2, timeout=10)
        block_the_loop(1.5)  # past the stall limit
        assert pulse.skipped > 0
        stalled_at = beats.count
        block_the_loop(0.5)  # still stalled: no beat at all meanwhile
        assert beats.count == stalled_at
        pulse.tick()  # the loop turns again
        await wait_until(lambda: beats.count > stalled_at, timeout=10)
    finally:
        await pulse.stop()


async def test_a_dead_heartbeat_thread_can_be_restarted_and_a_stopped_one_stays_stopped() -> None:
    beats = Beats(die_after=3)
    pulse = heartbeat(beats)
    pulse.start()
    await wait_until(lambda: not pulse.running, timeout=10)
    assert beats.count == 3 and beats.closed == 1  # it closed its connection on the way out
    pulse.start()  # what the sharding's pulse does when it finds the thread dead
    await wait_until(lambda: beats.count > 3, timeout=10)
    await pulse.stop()
    assert not pulse.running and beats.opened == beats.closed == 2
    pulse.start()  # after stop, start is a no-op
    assert not pulse.running


async def test_stop_before_the_thread_runs_leaves_nothing_behind() -> None:
    beats = Beats()
    pulse = heartbeat(beats)
    pulse.start()
    await asyncio.gather(pulse.stop(), pulse.stop())
    assert not pulse.running
    assert beats.opened == beats.closed
