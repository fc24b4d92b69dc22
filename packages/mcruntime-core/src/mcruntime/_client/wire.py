"""The client side of HTTP/2 (RFC 9113), as far as watches need it.

A watch on a shared connection is a GET whose response is a long stream of
DATA frames, one per event. h2, a general implementation of both sides of the
protocol in pure Python, spent about a fifth of the CPU of each event on one
DATA frame: a frame object, flag sets, a state machine, an event object, and
the frame's ``repr`` built for a trace log nobody reads. This module does
only what a client of watches needs, with the checks that keep a hostile
server's cost bounded:

- frames are at most 16 KiB (the default we never raise) and a header block
  at most ``MAX_HEADER_BLOCK`` bytes with its CONTINUATION frames; anything
  larger is refused and the connection dropped;
- the server may not send more than the windows it was given, on the
  connection or on a stream;
- a push promise (disabled in our SETTINGS), a frame on stream 0 that belongs
  to a stream (or the other way round), a CONTINUATION out of place, a
  malformed SETTINGS, PING, RST_STREAM or GOAWAY: each is a :class:`WireError`
  that names it, and the caller closes the connection;
- PINGs and SETTINGS that keep coming while the server leaves our bytes
  unread (its acknowledgements piling up in ``backlog``) are a flood, refused
  with ``ENHANCE_YOUR_CALM``.

Header blocks are coded by ``_base/headerblock``: requests without the
dynamic table (nothing to keep in step), credentials never indexed; every
block the server sends is decoded, also for a stream we reset, so both
sides' tables stay in step. Requests never carry a body: a client that
only opens GETs never sends DATA, so the server's windows for us are not
tracked.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from .._base.h2frames import FrameReader
from .._base.headerblock import HeaderBlockError, HeaderDecoder, encode_request_block
from .._base.http2 import (
    CANCEL,
    COMPRESSION_ERROR,
    CONTINUATION,
    DEFAULT_WINDOW,
    ENABLE_PUSH,
    END_HEADERS,
    END_STREAM,
    ERROR_NAMES,
    FLOW_CONTROL_ERROR,
    FRAME_SIZE_ERROR,
    GOAWAY,
    HEADERS,
    INITIAL_WINDOW_SIZE,
    LAST_STREAM_ID,
    MAX_CONCURRENT_STREAMS,
    MAX_FRAME,
    MAX_HEADER_LIST_SIZE,
    PADDED,
    PING,
    PREFACE,
    PROTOCOL_ERROR,
    RST_STREAM,
    SETTINGS,
    WINDOW_UPDATE,
    error_name,
    frame,
    settings_payload,
)

__all__ = [
    "CANCEL",
    "COMPRESSION_ERROR",
    "ERROR_NAMES",
    "FLOW_CONTROL_ERROR",
    "FRAME_SIZE_ERROR",
    "MAX_FRAME",
    "MAX_HEADER_BLOCK",
    "PREFACE",
    "PROTOCOL_ERROR",
    "Listener",
    "Wire",
    "WireError",
    "error_name",
]

MAX_HEADER_BLOCK = 1 << 18
"""A response's header block, CONTINUATION frames included, coded and decoded."""


class WireError(Exception):
    """The server broke the protocol; the connection must close (with GOAWAY ``code``)."""

    def __init__(self, message: str, code: int = PROTOCOL_ERROR) -> None:
        super().__init__(message)
        self.code = code


class Listener(Protocol):
    """What a connection's owner hears, called while :meth:`Wire.receive` parses."""

    def on_settings(self) -> None: ...
    def on_response(self, stream_id: int, status: int, headers: list[tuple[bytes, bytes]]) -> None: ...
    def on_data(self, stream_id: int, data: bytes, flowed: int) -> None: ...
    def on_end(self, stream_id: int) -> None: ...
    def on_reset(self, stream_id: int, code: int) -> None: ...
    def on_ping_ack(self) -> None: ...
    def on_goaway(self, last_stream_id: int, code: int) -> None: ...


class _Window:
    """A stream the server may still send on: what it may send, and what was read and not yet given back."""

    __slots__ = ("answered", "left", "unacked")

    def __init__(self, size: int) -> None:
        self.left = size
        self.unacked = 0
        self.answered = False


class Wire(FrameReader):
    """One HTTP/2 connection's framing, for a client that opens GET streams and reads them.

    It parses what the server sent and calls its :class:`Listener`, and
    collects what to send in :meth:`data_to_send`; it never touches a socket.
    """

    def __init__(
        self,
        listener: Listener,
        *,
        stream_window: int,
        connection_window: int,
        backlog: Callable[[], int] | None = None,
    ) -> None:
        super().__init__(error=WireError, peer="server", max_header_block=MAX_HEADER_BLOCK, backlog=backlog)
        self._listener = listener
        self._stream_window = stream_window
        self._connection_window = connection_window
        self._connection_left = connection_window
        self._connection_unacked = 0
        self._decoder = HeaderDecoder(max_header_list_size=MAX_HEADER_BLOCK)
        self._streams: dict[int, _Window] = {}
        self._next_stream_id = 1
        self.max_concurrent_streams = 1 << 31
        """The server's SETTINGS_MAX_CONCURRENT_STREAMS (unlimited until it says)."""

    @property
    def exhausted(self) -> bool:
        """No stream id is left on this connection: new streams need another."""
        return self._next_stream_id > LAST_STREAM_ID

    # --- sending ---------------------------------------------------------------------

    def initiate(self) -> None:
        """The client's preface: SETTINGS (no push, our windows) and the connection's window."""
        settings = settings_payload(
            (
                (ENABLE_PUSH, 0),
                (INITIAL_WINDOW_SIZE, self._stream_window),
                (MAX_HEADER_LIST_SIZE, MAX_HEADER_BLOCK),
            )
        )
        self._out += PREFACE + frame(SETTINGS, 0, 0, settings)
        if self._connection_window > DEFAULT_WINDOW:
            increment = self._connection_window - DEFAULT_WINDOW
            self._out += frame(WINDOW_UPDATE, 0, 0, increment.to_bytes(4, "big"))

    def open_stream(self, headers: list[tuple[bytes, bytes]]) -> int:
        """Send a request without a body (HEADERS with END_STREAM); its stream id."""
        if self.exhausted:
            raise WireError("no stream id left on the connection", 0)
        stream_id = self._next_stream_id
        self._next_stream_id += 2
        # No Huffman coding: each watch sends its cluster's token (a JWT of a kilobyte or
        # so, never indexed), and coding it in pure Python was 8 % of a 10,000-cluster
        # engage for a few hundred bytes saved on the wire.
        block = encode_request_block(headers)
        size = self._max_frame_out
        first, rest = block[:size], block[size:]
        self._out += frame(HEADERS, END_STREAM | (0 if rest else END_HEADERS), stream_id, first)
        while rest:
            chunk, rest = rest[:size], rest[size:]
            self._out += frame(CONTINUATION, 0 if rest else END_HEADERS, stream_id, chunk)
        self._streams[stream_id] = _Window(self._stream_window)
        return stream_id

    def consumed(self, stream_id: int, flowed: int) -> None:
        """``flowed`` bytes of ``stream_id`` were read or dropped: open the windows again.

        A window is given back in one WINDOW_UPDATE once half of it was read,
        so the server never waits on a reader that keeps up.
        """
        self._connection_unacked += flowed
        if self._connection_unacked >= self._connection_window // 2:
            self._out += frame(WINDOW_UPDATE, 0, 0, self._connection_unacked.to_bytes(4, "big"))
            self._connection_left += self._connection_unacked
            self._connection_unacked = 0
        window = self._streams.get(stream_id)
        if window is None:
            return  # ended or reset: only the connection's window matters now
        window.unacked += flowed
        if window.unacked >= self._stream_window // 2:
            self._out += frame(WINDOW_UPDATE, 0, stream_id, window.unacked.to_bytes(4, "big"))
            window.left += window.unacked
            window.unacked = 0

    def reset(self, stream_id: int, code: int = CANCEL) -> None:
        """Stop a stream the server may still send on; frames in flight for it are dropped."""
        if self._streams.pop(stream_id, None) is not None:
            self._out += frame(RST_STREAM, 0, stream_id, code.to_bytes(4, "big"))

    def ping(self, opaque: bytes) -> None:
        self._out += frame(PING, 0, 0, opaque)

    def goaway(self, code: int = 0) -> None:
        """Tell the server this connection opens nothing more (its last stream: none of its own)."""
        self._out += frame(GOAWAY, 0, 0, (0).to_bytes(4, "big") + code.to_bytes(4, "big"))

    # --- receiving -------------------------------------------------------------------

    def _stream_frame(self, stream_id: int, what: str) -> _Window | None:
        """The open stream a stream-level frame is for; ``None`` for one closed or reset already."""
        if stream_id == 0:
            raise WireError(f"{what} on stream 0")
        window = self._streams.get(stream_id)
        if window is None and (stream_id >= self._next_stream_id or not stream_id & 1):
            raise WireError(f"{what} on stream {stream_id}, which this client never opened")
        return window

    def _data(self, flags: int, stream_id: int, payload: bytes) -> None:
        window = self._stream_frame(stream_id, "DATA")
        flowed = len(payload)
        self._connection_left -= flowed
        if self._connection_left < 0:
            raise WireError("the server sent more than the connection's window", FLOW_CONTROL_ERROR)
        if flags & PADDED:
            payload = self._unpadded(payload, "DATA")
        if window is None:  # in flight when we reset it, or after its end: give the connection's window back
            self.consumed(stream_id, flowed)
            return
        window.left -= flowed
        if window.left < 0:
            raise WireError(f"the server sent more than stream {stream_id}'s window", FLOW_CONTROL_ERROR)
        self._listener.on_data(stream_id, payload, flowed)
        if flags & END_STREAM:
            self._end(stream_id)

    def _header_block(self, stream_id: int, flags: int, block: bytes) -> None:
        try:  # decoded even for a stream we reset: the server's table changed with it
            headers = self._decoder.decode(block)
        except HeaderBlockError as error:
            raise WireError(f"a header block that does not decode: {error}", COMPRESSION_ERROR) from None
        window = self._stream_frame(stream_id, "HEADERS")
        if window is None:
            return
        if not window.answered:
            status = _status(headers)
            if status >= 200:
                window.answered = True
                self._listener.on_response(stream_id, status, headers)
            elif flags & END_STREAM:
                raise WireError(f"stream {stream_id} ended with an informational response")
        # A second block is the response's trailers: nothing a watch reads.
        if flags & END_STREAM:
            self._end(stream_id)

    def _end(self, stream_id: int) -> None:
        del self._streams[stream_id]
        self._listener.on_end(stream_id)

    def _rst_stream(self, stream_id: int, code: int) -> None:
        if self._stream_frame(stream_id, "RST_STREAM") is not None:
            del self._streams[stream_id]
            self._listener.on_reset(stream_id, code)

    def _window_update(self, stream_id: int, increment: int) -> None:
        pass  # a client that sends no DATA has no window of the server's to track

    def _push_refusal(self) -> str:
        return "a PUSH_PROMISE, though push is disabled"

    def _setting(self, ident: int, value: int) -> None:
        # HEADER_TABLE_SIZE bounds the table our encoder may fill: it fills none.
        if ident == MAX_CONCURRENT_STREAMS:
            self.max_concurrent_streams = value

    def _settings_applied(self) -> None:
        self._listener.on_settings()

    def _ping_acknowledged(self) -> None:
        self._listener.on_ping_ack()

    def _peer_goaway(self, last_stream_id: int, code: int) -> None:
        self._listener.on_goaway(last_stream_id, code)


def _status(headers: list[tuple[bytes, bytes]]) -> int:
    for name, value in headers:
        if name == b":status":
            if len(value) == 3 and value.isdigit():
                return int(value)
            break
    raise WireError("a response without a valid :status")
