"""A webhook connection that speaks HTTP/2: each stream a call, each call a task of its own.

The framing is :mod:`h2wire`'s; this is the asyncio side. A call's handler runs
as a task the connection owns; its exceptions are answered 500 and logged,
never lost. What a client can cost is bounded on top of the framing's bounds:

- ``max_streams`` handlers per connection, counting those whose stream the
  client already reset (a reset does not stop a handler that may be writing),
  so resetting streams as fast as they open buys no extra work;
- a body's bytes are kept up to ``max_body`` and answered 413 beyond;
- when the client stops reading, we stop reading from it, so nothing it
  makes us answer (PING, SETTINGS, responses) piles up unsent;
- a connection with no call in flight and nothing heard for
  ``IDLE_TIMEOUT`` seconds is closed (with GOAWAY), one whose client read
  nothing, or took none of the answers left after that GOAWAY, for as long
  is dropped, and one that breaks the protocol is closed at once, with a
  warning naming the peer and the fault.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import TYPE_CHECKING, cast

from .._base.http2 import CANCEL, NO_ERROR, PROTOCOL_ERROR, REFUSED_STREAM, error_name
from .exchange import BodyLost, BodyTooLarge, Call, Reply, caller_timeout
from .h2wire import ProtocolViolation, ServerWire

if TYPE_CHECKING:
    from .exchange import Serve

log = logging.getLogger("mcruntime.webhook")

IDLE_TIMEOUT = 90.0
"""Seconds a connection with no call in flight is kept while the client says nothing (API servers PING)."""
MAX_HEADER_BLOCK = 1 << 16
"""A request's header block: a webhook call's are a few hundred bytes."""
STREAM_WINDOW = 1 << 20
"""What a client may send on one stream before we give the window back: most bodies, in one go."""


class _Body:
    """A request body as it arrives, and the future its reader waits on."""

    __slots__ = ("chunks", "done", "limit", "size")

    def __init__(self, limit: int, loop: asyncio.AbstractEventLoop) -> None:
        self.chunks: list[bytes] = []
        self.size = 0
        self.limit = limit
        self.done: asyncio.Future[None] = loop.create_future()

    def add(self, data: bytes) -> None:
        if self.done.done():
            return  # past the limit already (or lost): dropped, the stream is answered or gone
        self.size += len(data)
        if self.size > self.limit:
            self.fail(BodyTooLarge())
        else:
            self.chunks.append(data)

    def end(self) -> None:
        if not self.done.done():
            self.done.set_result(None)

    def fail(self, error: Exception) -> None:
        self.chunks.clear()
        if not self.done.done():
            self.done.set_exception(error)
            self.done.exception()  # retrieved: a call refused before its body is read must not log it

    async def read(self) -> bytes:
        await asyncio.shield(self.done)
        return b"".join(self.chunks)


def _header(headers: list[tuple[bytes, bytes]], name: bytes) -> bytes | None:
    for key, value in headers:
        if key == name:
            return value
    return None


class Http2Connection(asyncio.Protocol):
    """One client's HTTP/2 connection to the webhook server."""

    def __init__(self, serve: Serve, *, max_streams: int, max_body: int, settle: float) -> None:
        self._serve = serve
        self._settle = settle
        self._max_streams = max_streams
        self._max_body = max_body
        self._wire = ServerWire(
            self, max_streams=max_streams, stream_window=STREAM_WINDOW, max_header_block=MAX_HEADER_BLOCK
        )
        self._bodies: dict[int, _Body] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._busy = 0
        """Calls whose handler has not returned (a task can outlive that by a moment)."""
        self._transport: asyncio.Transport | None = None
        self._peer = "?"
        self._heard = 0.0
        self._idle: asyncio.TimerHandle | None = None
        self._draining = False
        self._stalled = False
        """The client stopped reading what we send (the transport's buffer is full)."""

    @property
    def transport(self) -> asyncio.Transport | None:
        return self._transport

    # --- the transport's side ---------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast("asyncio.Transport", transport)
        peer = transport.get_extra_info("peername")
        self._peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        self._wire.initiate()
        self._send()
        loop = asyncio.get_running_loop()
        self._heard = loop.time()
        self._idle = loop.call_later(IDLE_TIMEOUT, self._check_idle)

    def data_received(self, data: bytes) -> None:
        if self._transport is None or self._transport.is_closing():
            return
        self._heard = asyncio.get_running_loop().time()
        try:
            self._wire.receive(data)
        except ProtocolViolation as violation:
            log.warning(
                "webhook client %s broke HTTP/2: %s; closing its connection (%s)",
                self._peer,
                violation,
                error_name(violation.code),
            )
            self._wire.goaway(violation.code, str(violation).encode())
            self._send()
            self._transport.close()
            return
        self._send()
        self._close_if_drained()

    def eof_received(self) -> bool | None:
        return False  # the client is done sending: close (calls in flight lose their answer)

    def pause_writing(self) -> None:
        self._stalled = True
        if self._transport is not None:
            self._transport.pause_reading()

    def resume_writing(self) -> None:
        self._stalled = False
        if self._transport is not None and not self._transport.is_closing():
            self._transport.resume_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._idle is not None:
            self._idle.cancel()
        for body in self._bodies.values():
            body.fail(BodyLost())
        self._bodies.clear()

    # --- the wire's side --------------------------------------------------------------

    def on_request(self, stream_id: int, headers: list[tuple[bytes, bytes]], ended: bool) -> None:
        method, path = _header(headers, b":method"), _header(headers, b":path")
        if method is None or path is None or self._draining:
            self._wire.reset(stream_id, REFUSED_STREAM if self._draining else PROTOCOL_ERROR)
            return
        if self._busy >= self._max_streams:
            # Handlers of streams the client reset still run: they count until they end.
            self._wire.reset(stream_id, REFUSED_STREAM)
            return
        body = self._bodies[stream_id] = _Body(self._max_body, asyncio.get_running_loop())
        length = _header(headers, b"content-length")
        if length is not None and length.isdigit() and int(length) > self._max_body:
            body.fail(BodyTooLarge())  # known before the body comes: none of it is kept
        content_type = _header(headers, b"content-type") or b""
        target, _, query = path.decode("latin-1").partition("?")
        call = Call(
            method.decode("latin-1"),
            target,
            content_type.decode("latin-1").partition(";")[0].strip().lower(),
            body.read,
            caller_timeout(query),
        )
        self._busy += 1
        task = asyncio.get_running_loop().create_task(self._answer(stream_id, call, body))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def on_body(self, stream_id: int, data: bytes) -> None:
        body = self._bodies.get(stream_id)
        if body is not None:
            body.add(data)

    def on_end(self, stream_id: int) -> None:
        body = self._bodies.get(stream_id)
        if body is not None:
            body.end()

    def on_reset(self, stream_id: int, code: int) -> None:
        body = self._bodies.pop(stream_id, None)
        if body is not None:
            body.fail(BodyLost())

    def on_goaway(self, code: int) -> None:
        if code != NO_ERROR:
            log.warning("webhook client %s closed its connection: %s", self._peer, error_name(code))
        self.drain()

    # --- calls ------------------------------------------------------------------------

    async def _answer(self, stream_id: int, call: Call, body: _Body) -> None:
        try:
            reply = await self._serve(call)
            if not body.done.done():
                # Refused without reading it (a 404, a 405): answered once the request ended, as a
                # client expects (an answer that ends the stream early makes it stop and reset).
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self._settle):
                        await asyncio.wait([body.done])
        except Exception:
            log.exception("webhook call %s %s failed", call.method, call.path)
            reply = Reply.text(500, f"the webhook server failed on {call.path}")
        except asyncio.CancelledError:  # the server is closing: no answer comes, the client may retry
            self._wire.reset(stream_id, CANCEL)
            self._send()
            raise
        finally:
            self._bodies.pop(stream_id, None)
            self._busy -= 1
        if self._transport is None or self._transport.is_closing():
            return
        headers = [
            (b"content-type", reply.content_type.encode()),
            (b"content-length", b"%d" % len(reply.body)),
        ]
        self._wire.respond(stream_id, reply.status, headers, reply.body)
        self._send()
        self._close_if_drained()

    def drain(self) -> None:
        """Open no more streams; close once the calls in flight are answered."""
        if self._transport is None or self._transport.is_closing():
            return
        if not self._draining:
            self._draining = True
            self._wire.goaway(NO_ERROR)
            self._send()
        self._close_if_drained()

    def _close_if_drained(self) -> None:
        if (
            self._draining
            and not self._busy
            and self._wire.open_streams == 0
            and self._transport is not None
            and not self._transport.is_closing()
        ):
            self._transport.close()

    def cancel_calls(self) -> list[asyncio.Task[None]]:
        """Cut the calls still running short (the server is closing); returns their tasks.

        A call whose handler was running answers per its ``on_error`` (the
        server's doing); one still reading its body is reset.
        """
        cut = list(self._tasks)
        for task in cut:
            task.cancel()
        return cut

    def _send(self) -> None:
        data = self._wire.data_to_send()
        if data and self._transport is not None and not self._transport.is_closing():
            self._transport.write(data)

    def _check_idle(self) -> None:
        loop = asyncio.get_running_loop()
        quiet = loop.time() - self._heard
        if self._transport is None or self._transport.is_closing():
            return
        if quiet >= IDLE_TIMEOUT and (self._stalled or (self._draining and not self._busy)):
            # Closing politely would wait for it to read what is buffered, or to open the window
            # our answers wait on: it never will.
            log.warning(
                "webhook client %s %s for %.0fs; dropping its connection",
                self._peer,
                "read nothing" if self._stalled else f"took none of its {self._wire.open_streams} answers",
                quiet,
            )
            self._transport.abort()
            return
        if self._busy or quiet < IDLE_TIMEOUT:
            self._idle = loop.call_later(max(IDLE_TIMEOUT - quiet, 1.0), self._check_idle)
            return
        self.drain()
        # Answers may still wait on the client's window: it gets as long again to take them.
        self._heard = loop.time()
        self._idle = loop.call_later(IDLE_TIMEOUT, self._check_idle)
