"""``wait_until``: the deadline bounds the condition itself, and a miss says what it saw."""

from __future__ import annotations

import asyncio

import pytest

from mcruntime.testing import wait_until


async def test_a_condition_that_hangs_fails_at_the_deadline_and_is_cancelled() -> None:
    cancelled = asyncio.Event()

    async def hangs() -> bool:
        try:
            await asyncio.Event().wait()  # a read from a stopped API server
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return True

    with pytest.raises(AssertionError) as raised:
        await wait_until(hangs, timeout=0.2, what="the object exists")
    assert str(raised.value) == "not within 0.2s: the object exists (its last check was still running)"
    assert cancelled.is_set()


async def test_a_quick_awaitable_condition_that_misses_says_what_it_last_returned() -> None:
    # Found by a review: the last check began after the deadline, under a timeout already
    # expired, and was cancelled at once: every miss read "its last check was still running".
    async def quick() -> list[str]:
        await asyncio.sleep(0.001)  # a GET that answers in a millisecond
        return []

    for _ in range(5):
        with pytest.raises(AssertionError) as raised:
            await wait_until(quick, timeout=0.3, interval=0.05, what="colors")
        assert str(raised.value) == "not within 0.3s: colors (it last returned [])"


async def test_a_check_that_hangs_after_answering_names_the_answer_before() -> None:
    calls = 0

    async def answers_then_hangs() -> bool:
        nonlocal calls
        calls += 1
        if calls > 1:
            await asyncio.Event().wait()
        return False

    with pytest.raises(AssertionError) as raised:
        await wait_until(answers_then_hangs, timeout=0.2, interval=0.01, what="ready")
    assert str(raised.value) == (
        "not within 0.2s: ready (its last check was still running; the one before returned False)"
    )


async def test_a_miss_names_the_condition_and_what_it_last_returned() -> None:
    def nothing_yet() -> list[str]:
        return []

    with pytest.raises(AssertionError) as raised:
        await wait_until(nothing_yet, timeout=0.1, interval=0.01)
    message = str(raised.value)
    assert message.startswith("not within 0.1s: test_a_miss_names_the_condition_and_what_it_last_returned.")
    assert message.endswith("nothing_yet (it last returned [])"), message


class _Pending:
    """Falsy, with a long repr: a status still without the condition sought."""

    def __bool__(self) -> bool:
        return False

    def __repr__(self) -> str:
        return "Pending(" + "x" * 1000 + ")"


async def test_a_long_last_result_is_cut() -> None:
    with pytest.raises(AssertionError) as raised:
        await wait_until(_Pending, timeout=0.05, what="ready")
    message = str(raised.value)
    assert message.startswith("not within 0.05s: ready (it last returned Pending(xxx"), message
    assert message.endswith("… (1009 characters))"), message
    assert len(message) < 300


async def test_a_condition_that_raises_still_raises_its_own_error() -> None:
    def broken() -> bool:
        raise LookupError("no such cluster")

    with pytest.raises(LookupError, match="no such cluster"):
        await wait_until(broken, timeout=1)
