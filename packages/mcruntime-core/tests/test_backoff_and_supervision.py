"""The one backoff and supervised loops: capped, overflow-safe, never silent."""

from __future__ import annotations

import asyncio
import logging

import pytest
from hypothesis import given
from hypothesis import strategies as st

import mcruntime as mcr
from mcruntime import Backoff
from mcruntime._base.tasks import TaskSet


def test_backoff_doubles_from_base_and_stays_at_cap() -> None:
    backoff = Backoff(base=0.2, cap=30.0, jitter=0.0)
    assert [backoff.delay(n) for n in range(4)] == pytest.approx([0.2, 0.4, 0.8, 1.6])
    assert backoff.delay(8) == 30.0  # 0.2 * 2**8 = 51.2, over the cap
    assert backoff.delay(10_000) == 30.0


def test_backoff_survives_counts_far_past_float_range() -> None:
    backoff = Backoff(base=0.005, cap=1000.0)
    for failures in (1_023, 1_024, 1_025, 5_000, 10**9):
        delay = backoff.delay(failures)
        assert 500.0 <= delay <= 1000.0


@given(
    base=st.floats(min_value=0.0, max_value=10.0),
    extra=st.floats(min_value=0.0, max_value=1000.0),
    factor=st.floats(min_value=1.0, max_value=10.0),
    jitter=st.floats(min_value=0.0, max_value=1.0),
    failures=st.integers(min_value=0, max_value=10**12),
)
def test_backoff_is_never_negative_nor_over_cap(
    base: float, extra: float, factor: float, jitter: float, failures: int
) -> None:
    backoff = Backoff(base=base, cap=base + extra, factor=factor, jitter=jitter)
    assert 0.0 <= backoff.delay(failures) <= backoff.cap


def test_backoff_refuses_nonsense() -> None:
    with pytest.raises(ValueError, match="base <= cap"):
        Backoff(base=2.0, cap=1.0)
    with pytest.raises(ValueError, match="factor"):
        Backoff(factor=0.5)
    with pytest.raises(ValueError, match="jitter"):
        Backoff(jitter=1.5)


async def test_backoff_sleep_wakes_early_when_told() -> None:
    wake = asyncio.Event()
    asyncio.get_running_loop().call_soon(wake.set)
    async with asyncio.timeout(5):
        chosen = await Backoff(base=60.0, cap=60.0, jitter=0.0).sleep(0, wake=wake)
    assert chosen == 60.0  # the chosen delay, although the wait ended at once


async def test_a_supervised_loop_that_dies_is_logged_counted_and_restarted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    tasks = TaskSet("owner")
    crashes: list[tuple[str, str]] = []
    tasks.crash_listeners.append(lambda name, error: crashes.append((name, str(error))))
    runs = 0
    recovered = asyncio.Event()

    async def flaky() -> None:
        nonlocal runs
        runs += 1
        if runs <= 3:
            raise RuntimeError(f"boom {runs}")
        recovered.set()
        await asyncio.Event().wait()

    with caplog.at_level(logging.ERROR, logger="mcruntime.tasks"):
        tasks.supervise(flaky, "flaky", backoff=Backoff(base=0.0, cap=0.0))
        async with asyncio.timeout(5):
            await recovered.wait()
    (status,) = tasks.loops()
    assert (status.name, status.crashes, status.restarting) == ("flaky", 3, False)
    assert status.last_error == "RuntimeError: boom 3"
    assert crashes == [("flaky", "boom 1"), ("flaky", "boom 2"), ("flaky", "boom 3")]
    died = [record for record in caplog.records if "loop flaky died" in record.getMessage()]
    assert len(died) == 3 and all(record.exc_info for record in died)  # with tracebacks
    assert tasks.failing() == []
    await tasks.close()
    assert len(tasks) == 0


async def test_a_supervised_loop_survives_5000_consecutive_crashes() -> None:
    tasks = TaskSet("owner")
    delays: list[float] = []

    class Recording(Backoff):
        def delay(self, failures: int) -> float:
            chosen = Backoff(base=0.2, cap=30.0).delay(failures)
            delays.append(chosen)
            return 0.0

    done = asyncio.Event()
    runs = 0

    async def always_failing() -> None:
        nonlocal runs
        runs += 1
        if runs > 5000:
            done.set()
            await asyncio.Event().wait()
        raise ValueError("still broken")

    logging.getLogger("mcruntime.tasks").disabled = True
    try:
        tasks.supervise(always_failing, "broken", backoff=Recording())
        async with asyncio.timeout(60):
            await done.wait()
    finally:
        logging.getLogger("mcruntime.tasks").disabled = False
    assert len(delays) == 5000
    assert max(delays) <= 30.0 and min(delays[-100:]) >= 15.0  # at its cap, jittered
    await tasks.close()


async def test_a_loop_that_returns_is_not_restarted() -> None:
    tasks = TaskSet("owner")
    runs = 0

    async def once() -> None:
        nonlocal runs
        runs += 1

    task = tasks.supervise(once, "once")
    await task
    assert runs == 1 and tasks.failing() == []
    await tasks.close()


def test_request_retries_use_the_capped_backoff_at_any_attempt_count() -> None:
    policy = mcr.RetryPolicy(attempts=10_000, base_delay=0.2, max_delay=10.0)
    delays = [policy.delay(attempt) for attempt in range(5000)]
    assert max(delays) <= 10.0 and min(delays) >= 0.0
    assert policy.delay(4999, retry_after=42.0) == 42.0  # the server's Retry-After is honoured
