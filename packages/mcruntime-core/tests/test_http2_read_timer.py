"""The read timeout of a watch's HTTP/2 streams: one timer per connection, not one per stream or wait.

A watch waits once per event. Each wait tells its connection's sweep when
it would be silent; the sweep fires at the earliest such deadline (but not
more often than a quarter of the read timeout), fails every wait that lasted
its timeout, and comes back for the next one. These tests run the sweep by
hand (no clock is waited on); the timeout against a real kube-apiserver that
stops answering is in ``test_http2_watches.py``.
"""

from __future__ import annotations

import asyncio

import pytest

from mcruntime._client.multiplex import Stream, StreamClosed
from mcruntime._client.silence import SLACK, Sweep

READ_TIMEOUT = 600.0  # never reached by the clock in these tests: the sweep is run by hand


class _Channel:
    """What a stream asks of its connection, recorded; the sweep is the real one."""

    def __init__(self) -> None:
        self.pings = 0
        self.given_back: list[int] = []
        self.resets: list[int] = []
        self.streams: dict[int, Stream] = {}
        self.sweep = Sweep(lambda: [stream._silent for stream in self.streams.values()])

    def open(self, read_timeout: float | None = READ_TIMEOUT) -> Stream:
        stream_id = 2 * len(self.streams) + 1
        stream = self.streams[stream_id] = Stream(self, stream_id, read_timeout)  # type: ignore[arg-type]
        return stream

    def check_alive(self) -> None:
        self.pings += 1

    def consumed(self, stream_id: int, flowed: int) -> None:
        self.given_back.append(flowed)

    def reset(self, stream_id: int) -> None:
        self.resets.append(stream_id)
        self.streams.pop(stream_id, None)


async def _waiting(stream: Stream) -> asyncio.Task[None]:
    """A task waiting on ``stream``: its first step (which tells the sweep) has run."""
    waiter = asyncio.create_task(stream._wait())
    await asyncio.sleep(0)  # one turn of the loop: the task's first step runs (ready tasks run in order)
    assert stream._wakeup is not None
    return waiter


def _now() -> float:
    return asyncio.get_running_loop().time()


async def test_the_first_wait_arms_the_sweep_and_later_waits_leave_it() -> None:
    channel = _Channel()
    stream = channel.open()
    first = await _waiting(stream)
    armed = channel.sweep.armed_at
    assert armed == pytest.approx(stream._waiting_since + READ_TIMEOUT)
    stream._feed(b"event", 5)
    await first
    second = await _waiting(stream)
    assert channel.sweep.armed_at == armed  # not armed again for the second wait
    stream._feed(b"event", 5)
    await second
    stream.close()


async def test_the_streams_of_a_connection_share_its_one_timer() -> None:
    channel = _Channel()
    streams = [channel.open() for _ in range(50)]
    waiters = [await _waiting(stream) for stream in streams]
    assert channel.sweep.armed_at == pytest.approx(streams[0]._waiting_since + READ_TIMEOUT)
    for stream in streams:
        stream.close()
    await asyncio.gather(*waiters)
    assert all(isinstance(stream._error, StreamClosed) for stream in streams)
    channel.sweep.run()  # the deadline came: nobody waits any more, so it is not armed again
    assert channel.sweep.armed_at is None


async def test_a_sweep_during_a_newer_wait_moves_to_its_end() -> None:
    channel = _Channel()
    stream = channel.open()
    first = await _waiting(stream)
    stream._feed(b"event", 5)
    await first
    second = await _waiting(stream)
    channel.sweep.run()  # the deadline of the first wait: the second has not lasted the timeout
    assert not second.done()
    assert channel.sweep.armed_at == pytest.approx(stream._waiting_since + READ_TIMEOUT)
    assert channel.pings == 0
    stream.close()
    await second  # woken by the close; its reader then raises StreamClosed
    assert isinstance(stream._error, StreamClosed)


async def test_a_sweep_fails_only_the_wait_that_lasted_the_timeout_and_pings() -> None:
    channel = _Channel()
    silent, talking = channel.open(), channel.open()
    silent_waiter = await _waiting(silent)
    talking_waiter = await _waiting(talking)
    silent._waiting_since -= READ_TIMEOUT  # as if the whole timeout had passed in this wait
    channel.sweep.run()
    with pytest.raises(TimeoutError):
        await silent_waiter
    assert channel.pings == 1
    assert not talking_waiter.done()
    assert channel.sweep.armed_at == pytest.approx(talking._waiting_since + READ_TIMEOUT)
    silent.close()
    talking.close()
    await talking_waiter


async def test_sweeps_come_at_most_every_quarter_of_the_read_timeout() -> None:
    channel = _Channel()
    stream = channel.open()
    waiter = await _waiting(stream)
    stream._waiting_since -= READ_TIMEOUT - 1.0  # its deadline is a second away
    before = _now()
    channel.sweep.run()
    armed = channel.sweep.armed_at
    assert armed is not None
    assert armed >= before + READ_TIMEOUT * SLACK  # not a second later: a quarter of the timeout later
    assert armed <= _now() + READ_TIMEOUT * SLACK
    assert not waiter.done()
    stream.close()
    await waiter


async def test_a_shorter_timeout_brings_the_sweep_forward() -> None:
    channel = _Channel()
    slow = channel.open(READ_TIMEOUT)
    slow_waiter = await _waiting(slow)
    quick = channel.open(READ_TIMEOUT / 10)
    quick_waiter = await _waiting(quick)
    assert channel.sweep.armed_at == pytest.approx(quick._waiting_since + READ_TIMEOUT / 10)
    for stream in (slow, quick):
        stream.close()
    await asyncio.gather(slow_waiter, quick_waiter)


async def test_a_stopped_sweep_never_runs_and_waits_after_it_do_not_arm_it_early() -> None:
    channel = _Channel()
    stream = channel.open()
    waiter = await _waiting(stream)
    channel.sweep.stop()  # the connection was lost: its streams fail by that, not by the timer
    assert channel.sweep.armed_at is None
    stream._fail(StreamClosed("connection lost"))
    await waiter
    assert isinstance(stream._error, StreamClosed)


async def test_without_a_read_timeout_no_sweep_is_armed() -> None:
    channel = _Channel()
    stream = channel.open(None)
    waiter = await _waiting(stream)
    assert channel.sweep.armed_at is None
    stream._feed(b"event", 5)
    await waiter


async def test_a_stream_ended_before_its_response_says_so_instead_of_waiting() -> None:
    channel = _Channel()
    stream = channel.open()
    stream._end()
    with pytest.raises(StreamClosed, match="before its response"):
        await stream.response()
