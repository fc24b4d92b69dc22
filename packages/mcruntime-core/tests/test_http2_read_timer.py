"""The read timeout of a watch's HTTP/2 stream: one timer per stream, not one per wait.

A watch waits once per event, so the timer is armed by the first wait and,
when it fires, either fails the wait that has lasted the whole timeout or
moves on to the end of the wait in progress. These tests drive the timer's
callback directly (no clock is waited on); the timeout against a real
kube-apiserver that stops answering is in ``test_http2_watches.py``.
"""

from __future__ import annotations

import asyncio

import pytest

from mcruntime._client.multiplex import Stream, StreamClosed

READ_TIMEOUT = 600.0  # never reached by the clock in these tests: the callback is called by hand


class _Channel:
    """What a stream asks of its connection, recorded."""

    def __init__(self) -> None:
        self.pings = 0
        self.given_back: list[int] = []
        self.resets: list[int] = []

    def check_alive(self) -> None:
        self.pings += 1

    def consumed(self, stream_id: int, flowed: int) -> None:
        self.given_back.append(flowed)

    def reset(self, stream_id: int) -> None:
        self.resets.append(stream_id)


def _stream(channel: _Channel) -> Stream:
    return Stream(channel, 1, READ_TIMEOUT)  # type: ignore[arg-type]  # only the methods above are used


async def _waiting(stream: Stream) -> asyncio.Task[None]:
    """A task waiting on ``stream``: its first step (which arms the timer) has run."""
    waiter = asyncio.create_task(stream._wait())
    await asyncio.sleep(0)  # one turn of the loop: the task's first step runs (ready tasks run in order)
    assert stream._wakeup is not None
    return waiter


async def test_the_first_wait_arms_the_timer_and_later_waits_reuse_it() -> None:
    stream = _stream(_Channel())
    first = await _waiting(stream)
    timer = stream._silence
    assert timer is not None
    assert timer.when() == pytest.approx(stream._waiting_since + READ_TIMEOUT)
    stream._feed(b"event", 5)
    await first
    second = await _waiting(stream)
    assert stream._silence is timer  # not armed again for the second wait
    stream._feed(b"event", 5)
    await second
    stream.close()


async def test_a_timer_that_fires_during_a_newer_wait_moves_to_its_end() -> None:
    channel = _Channel()
    stream = _stream(channel)
    first = await _waiting(stream)
    stream._feed(b"event", 5)
    await first
    second = await _waiting(stream)
    stream._check_silence()  # the deadline of the first wait: the second has not lasted the timeout
    assert not second.done()
    moved = stream._silence
    assert moved is not None
    assert moved.when() == pytest.approx(stream._waiting_since + READ_TIMEOUT)
    assert channel.pings == 0
    stream.close()
    await second  # woken by the close; its reader then raises StreamClosed
    assert isinstance(stream._error, StreamClosed)


async def test_a_wait_that_lasted_the_timeout_raises_and_pings_the_connection() -> None:
    channel = _Channel()
    stream = _stream(channel)
    waiter = await _waiting(stream)
    stream._waiting_since -= READ_TIMEOUT  # as if the whole timeout had passed in this wait
    stream._check_silence()
    with pytest.raises(TimeoutError):
        await waiter
    assert channel.pings == 1
    assert stream._silence is None
    stream.close()


async def test_closing_the_stream_cancels_its_timer() -> None:
    stream = _stream(_Channel())
    waiter = await _waiting(stream)
    timer = stream._silence
    assert timer is not None
    stream.close()
    assert timer.cancelled() and stream._silence is None
    await waiter
    assert isinstance(stream._error, StreamClosed)


async def test_without_a_read_timeout_no_timer_is_armed() -> None:
    stream = Stream(_Channel(), 1, None)  # type: ignore[arg-type]
    waiter = await _waiting(stream)
    assert stream._silence is None
    stream._feed(b"event", 5)
    await waiter
