"""One watch read from a shared HTTP/2 connection: a stream, as its informer sees it.

The connection (``multiplex.py``) parses frames and hands each stream its
response, its chunks and its end; the stream holds them for one reader. Read
through :meth:`Stream.iter_any` it looks like aiohttp's response, so both
transports share the watch's code. Read through :meth:`Stream.deliver`, the
chunks are handled inside the connection's read, without waking a task per
event. Either way a chunk gives its flow-control window back only once it was
taken, so a reader who stops holds only its own stream shut.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections import deque
from collections.abc import AsyncIterator, Callable
from typing import Protocol

from .silence import Sweep
from .wording import StreamClosed


class _Connection(Protocol):
    """What a stream needs of the connection it rides on."""

    sweep: Sweep

    def consumed(self, stream_id: int, flowed: int, *, flush: bool = True) -> None: ...

    def reset(self, stream_id: int) -> None: ...

    def check_alive(self) -> None: ...


class WatchResponse(Protocol):
    """What a watch's reader uses of its response, over HTTP/1.1 (aiohttp's) or a stream here."""

    @property
    def status(self) -> int: ...

    @property
    def content(self) -> _Content: ...

    async def read(self) -> bytes: ...

    def close(self) -> None: ...


class _Content(Protocol):
    def iter_any(self) -> AsyncIterator[bytes]: ...


class Stream:
    """One watch on a shared HTTP/2 connection, read like aiohttp's response."""

    __slots__ = (
        "_broken",
        "_channel",
        "_chunks",
        "_clock",
        "_context",
        "_ended",
        "_error",
        "_read_timeout",
        "_sink",
        "_waiting_since",
        "_wakeup",
        "headers",
        "status",
        "stream_id",
    )

    def __init__(self, channel: _Connection, stream_id: int, read_timeout: float | None) -> None:
        self._channel = channel
        self.stream_id = stream_id
        self.status = 0
        self.headers: dict[str, str] = {}
        self._chunks: deque[tuple[bytes, int]] = deque()
        self._ended = False
        self._error: BaseException | None = None
        self._wakeup: asyncio.Future[None] | None = None
        self._read_timeout = read_timeout
        self._waiting_since = 0.0
        self._sink: Callable[[bytes], None] | None = None
        self._broken: Exception | None = None
        self._clock: Callable[[], float] | None = None
        self._context: contextvars.Context | None = None

    @property
    def content(self) -> Stream:
        return self

    @property
    def unread(self) -> int:
        """Bytes received and not yet read: at most the stream's window."""
        return sum(flowed for _data, flowed in self._chunks)

    async def response(self) -> None:
        """Wait for the response's headers (within the read timeout, as aiohttp's ``sock_read``)."""
        while not self.status:
            if self._error is not None:
                raise self._error
            if self._ended:
                raise StreamClosed("the server ended the watch stream before its response")
            await self._wait()

    async def iter_any(self) -> AsyncIterator[bytes]:
        """Each chunk as it arrived; its window reopens once it is taken."""
        while True:
            while not self._chunks:
                if self._error is not None:
                    raise self._error
                if self._ended:
                    return
                await self._wait()
            data, flowed = self._chunks.popleft()
            self._channel.consumed(self.stream_id, flowed)
            if data:
                yield data

    async def read(self) -> bytes:
        return b"".join([chunk async for chunk in self.iter_any()])

    async def deliver(self, sink: Callable[[bytes], None]) -> None:
        """Hand each chunk to ``sink`` in the connection's read itself; return when the stream ends.

        Read through :meth:`iter_any`, every event of a watch trickling in costs
        a wake-up of the reading task: one more event-loop iteration and task
        step between the socket and the informer (benchmark S8). Here the chunk
        is handled where it was read, in the caller's context. The read timeout
        then counts from the last chunk. An exception from ``sink`` stops the
        delivery and is raised here; the stream's own end or failure as well.
        """
        while self._chunks:  # what came before the call
            data, flowed = self._chunks.popleft()
            self._channel.consumed(self.stream_id, flowed)
            if data:
                sink(data)
        self._clock = asyncio.get_running_loop().time
        self._context = contextvars.copy_context()
        self._sink = sink
        try:
            while self._broken is None and self._error is None and not self._ended:
                await self._wait()
        finally:
            self._sink = self._context = None
        if self._broken is not None:
            raise self._broken
        if self._error is not None:
            raise self._error

    def close(self) -> None:
        """Reset the stream if it is still open; a reader waiting on it raises :class:`StreamClosed`."""
        if self._ended or self._error is not None:
            self._release()
            return
        self._error = StreamClosed("the watch stream was closed")
        self._release()
        self._channel.reset(self.stream_id)
        self._wake()

    def _release(self) -> None:
        """Give the connection's window back for what was received and never read."""
        unread = self.unread
        self._chunks.clear()
        if unread:
            self._channel.consumed(self.stream_id, unread)

    async def _wait(self) -> None:
        """Wait to be woken; :class:`TimeoutError` after the read timeout without a wake-up.

        The connection's one timer finds the wait silent (see :meth:`_silent`):
        a watch waits once per event, and a timeout context per wait (a timer
        armed and cancelled each time) was a tenth of the event path's cost.
        """
        loop = asyncio.get_running_loop()
        wakeup = self._wakeup = loop.create_future()
        timeout = self._read_timeout
        if timeout is not None:
            since = self._waiting_since = loop.time()
            self._channel.sweep.waiting(since + timeout, timeout)
        try:
            await wakeup
        except TimeoutError:
            self._channel.check_alive()
            raise
        finally:
            self._wakeup = None

    def _silent(self, now: float) -> tuple[float, float] | None:
        """The sweep's check: fail a wait that lasted the read timeout, or say when it will have."""
        wakeup = self._wakeup
        timeout = self._read_timeout
        if wakeup is None or wakeup.done() or timeout is None:
            return None  # nobody waits now: the next wait tells the sweep
        deadline = self._waiting_since + timeout
        if now < deadline:
            return deadline, timeout
        wakeup.set_exception(TimeoutError())
        return None

    def _wake(self) -> None:
        wakeup = self._wakeup
        if wakeup is not None and not wakeup.done():
            wakeup.set_result(None)

    # --- fed by the connection ------------------------------------------------

    def _answered(self, status: int, headers: dict[str, str]) -> None:
        self.status, self.headers = status, headers
        self._wake()

    def _feed(self, data: bytes, flowed: int) -> None:
        sink = self._sink
        if sink is None:
            self._chunks.append((data, flowed))
            self._wake()
            return
        self._channel.consumed(self.stream_id, flowed, flush=False)  # the read flushes after it
        assert self._clock is not None and self._context is not None
        self._waiting_since = self._clock()  # silence counts from the last chunk
        if not data:
            return
        try:
            self._context.run(sink, data)
        except Exception as error:  # raised to the delivery's caller, not into the connection's read
            self._sink = None
            self._broken = error
            self._wake()

    def _end(self) -> None:
        self._ended = True
        self._wake()

    def _fail(self, error: BaseException) -> None:
        if self._error is None and not self._ended:
            self._error = error
        self._wake()
