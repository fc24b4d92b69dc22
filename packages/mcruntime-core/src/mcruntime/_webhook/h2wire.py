"""The server side of HTTP/2 (RFC 9113), as far as a webhook needs it.

An API server that is offered ``h2`` sends its admission and conversion calls
as streams on one connection, each a POST with a short JSON body, each
answered by one short response. Over HTTP/1.1 it needs a connection per call
in flight and waits for a free one; that wait is most of what a webhook adds
to a write's p99 under load (see FIXES.md, S13).

This module only frames: it parses what the client sent, calls its
:class:`Listener`, and collects what to send; it never touches a socket. Every
cost a hostile client can impose is bounded:

- frames are at most 16 KiB (the default, never raised) and a request's
  header block at most ``max_header_block`` bytes over at most 64
  CONTINUATION frames (:class:`~mcruntime._base.h2frames.FrameReader`'s checks);
- the client may not send more than the windows it was given;
- at most ``max_streams`` streams are open; a stream over that is refused
  (RST_STREAM REFUSED_STREAM, which clients retry) and costs no handler;
- a PUSH_PROMISE, a frame on the wrong stream, a stream id that goes
  backwards, a malformed SETTINGS, PING, RST_STREAM, WINDOW_UPDATE or GOAWAY:
  each is a :class:`ProtocolViolation` naming it, and the connection closes
  with GOAWAY and the error's code;
- a fault confined to one stream (a malformed request, RFC 9113 8.2; a body
  that does not match its ``content-length``; a frame on a stream the client
  had ended) resets that stream only, as RFC 9113 5.4.2 says. h2spec's 145
  cases check all of this (``test_webhook_h2spec.py``).

What the server sends respects the client's windows: a response larger than
them waits, per stream, for its WINDOW_UPDATE.
"""

from __future__ import annotations

from typing import Protocol

from .._base.h2frames import SELF_DEPENDENT, FrameReader
from .._base.headerblock import TABLE_SIZE_ZERO, HeaderBlockError, HeaderDecoder, encode_block
from .._base.http2 import (
    COMPRESSION_ERROR,
    CONTINUATION,
    DATA,
    DEFAULT_WINDOW,
    END_HEADERS,
    END_STREAM,
    FLOW_CONTROL_ERROR,
    GOAWAY,
    HEADER_TABLE_SIZE,
    HEADERS,
    INITIAL_WINDOW_SIZE,
    LAST_STREAM_ID,
    MAX_CONCURRENT_STREAMS,
    MAX_HEADER_LIST_SIZE,
    NO_ERROR,
    PADDED,
    PREFACE,
    PROTOCOL_ERROR,
    REFUSED_STREAM,
    RST_STREAM,
    SETTINGS,
    STREAM_CLOSED,
    WINDOW_UPDATE,
    frame,
    settings_payload,
)


class ProtocolViolation(Exception):
    """The client broke the protocol; the connection closes with GOAWAY ``code``."""

    def __init__(self, message: str, code: int = PROTOCOL_ERROR) -> None:
        super().__init__(message)
        self.code = code


class Listener(Protocol):
    """What a connection's owner hears, called while :meth:`ServerWire.receive` parses."""

    def on_request(self, stream_id: int, headers: list[tuple[bytes, bytes]], ended: bool) -> None: ...
    def on_body(self, stream_id: int, data: bytes) -> None: ...
    def on_end(self, stream_id: int) -> None: ...
    def on_reset(self, stream_id: int, code: int) -> None: ...
    def on_goaway(self, code: int) -> None: ...


class _Stream:
    """An open stream: whether the client may still send, and what we may send it."""

    __slots__ = ("client_open", "expected", "left", "pending", "received", "sent_to_us")

    def __init__(self, send_window: int, receive_window: int, expected: int | None) -> None:
        self.client_open = True
        self.left = send_window
        self.received = receive_window
        self.expected = expected
        """The body's declared ``content-length``; a body of another length is malformed."""
        self.sent_to_us = 0
        self.pending: bytearray | None = None
        """The response's body that waits for the client's window; ``None`` before the response."""


class ServerWire(FrameReader):
    """One HTTP/2 connection's framing, for a server that answers POSTs.

    Our receive windows are given back as soon as a body's bytes arrive (the
    owner keeps each body only up to its own limit and resets the stream
    past it), so a client is never held up by the connection's window.
    """

    def __init__(
        self, listener: Listener, *, max_streams: int, stream_window: int, max_header_block: int
    ) -> None:
        super().__init__(error=ProtocolViolation, peer="client", max_header_block=max_header_block)
        self._listener = listener
        self._max_streams = max_streams
        self._stream_window = stream_window
        self._preface = False
        self._decoder = HeaderDecoder(max_header_list_size=max_header_block)
        self._table_update = True
        """Our next header block begins with a table size update to 0 (we never use the table)."""
        self._streams: dict[int, _Stream] = {}
        self._closed: dict[int, bool] = {}
        """Recently closed streams: True for one we reset (its late frames are ignored), False otherwise."""
        self._send_window = DEFAULT_WINDOW
        self._initial_send = DEFAULT_WINDOW
        self._connection_unacked = 0
        self.last_stream_id = 0
        """The highest stream the client opened; a GOAWAY names it."""
        self.closing = False
        """A GOAWAY was sent: streams above ``last_stream_id`` are ignored."""
        self._goaway_last: int | None = None
        """The last stream our first GOAWAY named: every later GOAWAY names it too (RFC 9113 6.8)."""

    @property
    def open_streams(self) -> int:
        return len(self._streams)

    # --- sending ---------------------------------------------------------------------

    def initiate(self) -> None:
        """The server's preface: SETTINGS (our limits and windows), and the connection's window."""
        settings = settings_payload(
            (
                (MAX_CONCURRENT_STREAMS, self._max_streams),
                (INITIAL_WINDOW_SIZE, self._stream_window),
                (MAX_HEADER_LIST_SIZE, self._max_header_block),
            )
        )
        self._out += frame(SETTINGS, 0, 0, settings)
        # One stream's window for each stream that may be open: no body waits on the connection.
        increment = min(self._stream_window * self._max_streams, LAST_STREAM_ID) - DEFAULT_WINDOW
        if increment > 0:
            self._out += frame(WINDOW_UPDATE, 0, 0, increment.to_bytes(4, "big"))

    def respond(self, stream_id: int, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> None:
        """Answer ``stream_id``: HEADERS, then ``body`` as far as the client's windows allow."""
        stream = self._streams.get(stream_id)
        if stream is None or stream.pending is not None:
            return  # reset by the client meanwhile (or answered already): nobody reads an answer
        block = encode_block([(b":status", b"%d" % status), *headers])
        if self._table_update:
            block = TABLE_SIZE_ZERO + block
            self._table_update = False
        size = self._max_frame_out
        first, rest = block[:size], block[size:]
        flags = (0 if body else END_STREAM) | (0 if rest else END_HEADERS)
        self._out += frame(HEADERS, flags, stream_id, first)
        while rest:
            chunk, rest = rest[:size], rest[size:]
            self._out += frame(CONTINUATION, 0 if rest else END_HEADERS, stream_id, chunk)
        stream.pending = bytearray(body)
        if body:
            self._flush(stream_id, stream)
        else:
            self._answered(stream_id, stream)

    def reset(self, stream_id: int, code: int) -> None:
        """End ``stream_id`` from our side: nothing more is read or sent on it."""
        if self._streams.pop(stream_id, None) is not None:
            self._out += frame(RST_STREAM, 0, stream_id, code.to_bytes(4, "big"))
            self._remember(stream_id, ours=True)

    def _remember(self, stream_id: int, *, ours: bool) -> None:
        """Record how a stream closed, for the frames that may still come for it (the last 128)."""
        self._closed[stream_id] = ours
        if len(self._closed) > _REMEMBERED:
            del self._closed[next(iter(self._closed))]

    def _stream_error(self, stream_id: int, code: int) -> None:
        """A fault confined to one stream (RFC 9113 5.4.2): reset it, and tell the owner if it knew it."""
        self._out += frame(RST_STREAM, 0, stream_id, code.to_bytes(4, "big"))
        if self._streams.pop(stream_id, None) is not None:
            self._listener.on_reset(stream_id, code)
        self._remember(stream_id, ours=True)

    def goaway(self, code: int = NO_ERROR, debug: bytes = b"") -> None:
        """No stream above the last one opened will be served; ``code`` says why."""
        self.closing = True
        if self._goaway_last is None:
            self._goaway_last = self.last_stream_id
        payload = self._goaway_last.to_bytes(4, "big") + code.to_bytes(4, "big") + debug[:256]
        self._out += frame(GOAWAY, 0, 0, payload)

    def _flush(self, stream_id: int, stream: _Stream) -> None:
        pending = stream.pending
        assert pending is not None
        while pending:
            size = min(len(pending), stream.left, self._send_window, self._max_frame_out)
            if size <= 0:
                return  # the rest waits for the client's WINDOW_UPDATE
            chunk = bytes(pending[:size])
            del pending[:size]
            stream.left -= size
            self._send_window -= size
            self._out += frame(DATA, 0 if pending else END_STREAM, stream_id, chunk)
        self._answered(stream_id, stream)

    def _answered(self, stream_id: int, stream: _Stream) -> None:
        """The response went out whole: the stream ends, and a body still coming is not wanted."""
        del self._streams[stream_id]
        if stream.client_open:
            # Answered before the request ended (a refused body): the client stops sending (RFC 9113 8.1).
            self._out += frame(RST_STREAM, 0, stream_id, NO_ERROR.to_bytes(4, "big"))
        self._remember(stream_id, ours=stream.client_open)

    def _flush_all(self) -> None:
        for stream_id, stream in list(self._streams.items()):
            if stream.pending:
                self._flush(stream_id, stream)

    # --- receiving -------------------------------------------------------------------

    def receive(self, data: bytes) -> None:
        """Parse the client's bytes, calling the listener per frame; raises :class:`ProtocolViolation`."""
        if self._in:
            self._in += data
            data = bytes(self._in)
            self._in.clear()
        position, end = 0, len(data)
        if not self._preface:
            if end < len(PREFACE):
                if not PREFACE.startswith(data):
                    raise ProtocolViolation("the connection did not begin with HTTP/2's preface")
                self._in += data
                return
            if not data.startswith(PREFACE):
                raise ProtocolViolation("the connection did not begin with HTTP/2's preface")
            self._preface = True
            position = len(PREFACE)
        self._frames(data, position)

    def _known(self, stream_id: int, what: str) -> _Stream | None:
        """The open stream a frame is for; ``None`` for one that was open once and is closed."""
        if stream_id == 0:
            raise ProtocolViolation(f"{what} on stream 0")
        stream = self._streams.get(stream_id)
        if stream is None and stream_id > self.last_stream_id and not self._ignored(stream_id):
            raise ProtocolViolation(f"{what} on stream {stream_id}, which the client never opened")
        return stream

    def _ignored(self, stream_id: int) -> bool:
        """A stream the client opened after our GOAWAY: its frames are dropped, not a fault.

        The client may have sent them before the GOAWAY reached it (a new call
        and its body, as separate frames); it retries such a call elsewhere.
        """
        return self._goaway_last is not None and stream_id > self._goaway_last

    def _on_closed(self, stream_id: int, what: str) -> None:
        """DATA or HEADERS for a stream that is not open: the client's fault only if it ended it normally.

        Ignored for a stream we reset or one opened after our GOAWAY (sent before
        either reached the client, RFC 9113 5.1, 6.8), and for one closed too long
        ago to be remembered: a body still on its way when we refused it may
        arrive after many other calls ended, and costs the connection nothing.
        """
        if self._closed.get(stream_id, True) or self._ignored(stream_id):
            return
        raise ProtocolViolation(f"{what} on stream {stream_id}, which is closed", STREAM_CLOSED)

    def _data(self, flags: int, stream_id: int, payload: bytes) -> None:
        stream = self._known(stream_id, "DATA")
        flowed = len(payload)
        self._connection_unacked += flowed
        if self._connection_unacked >= self._stream_window:
            self._out += frame(WINDOW_UPDATE, 0, 0, self._connection_unacked.to_bytes(4, "big"))
            self._connection_unacked = 0
        if stream is None:
            self._on_closed(stream_id, "DATA")
            return
        if not stream.client_open:
            self._stream_error(stream_id, STREAM_CLOSED)  # the client had ended it (half-closed)
            return
        stream.received -= flowed
        if stream.received < 0:
            raise ProtocolViolation(f"more than stream {stream_id}'s window", FLOW_CONTROL_ERROR)
        if flags & PADDED:
            payload = self._unpadded(payload, "DATA")
        stream.sent_to_us += len(payload)
        if stream.expected is not None and stream.sent_to_us > stream.expected:
            self._stream_error(stream_id, PROTOCOL_ERROR)  # longer than its content-length
            return
        if stream.received < self._stream_window // 2 and not flags & END_STREAM:
            given = self._stream_window - stream.received
            stream.received = self._stream_window
            self._out += frame(WINDOW_UPDATE, 0, stream_id, given.to_bytes(4, "big"))
        if payload:
            self._listener.on_body(stream_id, payload)
        if flags & END_STREAM and stream_id in self._streams:
            self._request_ended(stream_id, stream)

    def _request_ended(self, stream_id: int, stream: _Stream) -> None:
        if stream.expected is not None and stream.sent_to_us != stream.expected:
            self._stream_error(stream_id, PROTOCOL_ERROR)  # shorter than its content-length
            return
        stream.client_open = False
        self._listener.on_end(stream_id)

    def _header_block(self, stream_id: int, flags: int, block: bytes) -> None:
        try:  # decoded even for a stream we ignore: the client's table changed with it
            headers = self._decoder.decode(block)
        except HeaderBlockError as error:
            message = f"a header block that does not decode: {error}"
            raise ProtocolViolation(message, COMPRESSION_ERROR) from None
        ended = bool(flags & END_STREAM)
        stream = self._streams.get(stream_id)
        if stream is not None:  # trailers: they must end the request, and nothing here reads them
            if not stream.client_open:
                self._stream_error(stream_id, STREAM_CLOSED)
            elif not ended or _malformed(headers, trailers=True) is not None:
                raise ProtocolViolation(f"a second header block on stream {stream_id} that does not end it")
            else:
                self._request_ended(stream_id, stream)
            return
        if stream_id <= self.last_stream_id:
            if stream_id not in self._closed:
                raise ProtocolViolation(f"stream {stream_id} opened after stream {self.last_stream_id}")
            self._on_closed(stream_id, "HEADERS")
            return
        if not stream_id & 1:
            raise ProtocolViolation(f"the client opened stream {stream_id}, an even (server's) id")
        if self._ignored(stream_id):
            return  # after our GOAWAY: ignored, and the client knows to retry it elsewhere
        self.last_stream_id = stream_id
        malformed = "depends on itself" if flags & SELF_DEPENDENT else _malformed(headers, trailers=False)
        expected = _content_length(headers)
        if malformed is not None or expected == -1:
            self._stream_error(stream_id, PROTOCOL_ERROR)
            return
        if len(self._streams) >= self._max_streams:
            self._stream_error(stream_id, REFUSED_STREAM)
            return
        stream = self._streams[stream_id] = _Stream(self._initial_send, self._stream_window, expected)
        self._listener.on_request(stream_id, headers, ended)
        if ended:
            self._request_ended(stream_id, stream)

    def _rst_stream(self, stream_id: int, code: int) -> None:
        if self._known(stream_id, "RST_STREAM") is not None:
            del self._streams[stream_id]
            self._remember(stream_id, ours=False)
            self._listener.on_reset(stream_id, code)

    def _window_update(self, stream_id: int, increment: int) -> None:
        if increment == 0 and stream_id == 0:
            raise ProtocolViolation("a WINDOW_UPDATE of 0 on the connection")
        if increment == 0:
            if self._known(stream_id, "WINDOW_UPDATE") is not None:
                self._stream_error(stream_id, PROTOCOL_ERROR)
            return
        if stream_id == 0:
            self._send_window += increment
            if self._send_window > LAST_STREAM_ID:
                raise ProtocolViolation("the connection's window over 2^31-1", FLOW_CONTROL_ERROR)
            self._flush_all()
            return
        stream = self._known(stream_id, "WINDOW_UPDATE")
        if stream is None:
            return  # for a stream that ended meanwhile
        stream.left += increment
        if stream.left > LAST_STREAM_ID:
            self._stream_error(stream_id, FLOW_CONTROL_ERROR)  # that stream's fault only
            return
        if stream.pending:
            self._flush(stream_id, stream)

    def _push_refusal(self) -> str:
        return "a PUSH_PROMISE from a client"

    def _setting(self, ident: int, value: int) -> None:
        if ident == HEADER_TABLE_SIZE:  # we never index, but say so again in our next block
            self._table_update = True
        elif ident == INITIAL_WINDOW_SIZE:
            delta, self._initial_send = value - self._initial_send, value
            for stream in self._streams.values():
                stream.left += delta

    def _settings_applied(self) -> None:
        self._flush_all()

    def _peer_goaway(self, last_stream_id: int, code: int) -> None:
        self._listener.on_goaway(code)

    def _self_dependent(self, stream_id: int) -> None:
        self._stream_error(stream_id, PROTOCOL_ERROR)


_REMEMBERED = 128
_PSEUDO = frozenset((b":method", b":scheme", b":authority", b":path"))
_CONNECTION_SPECIFIC = frozenset(
    (b"connection", b"keep-alive", b"proxy-connection", b"transfer-encoding", b"upgrade")
)


def _malformed(headers: list[tuple[bytes, bytes]], *, trailers: bool) -> str | None:
    """What makes a request's header block malformed (RFC 9113 8.2, 8.3), or ``None``."""
    seen: set[bytes] = set()
    regular = False
    for name, value in headers:
        if name[:1] == b":":
            if trailers or regular or name not in _PSEUDO or name in seen:
                return f"pseudo-header {name.decode('latin-1')!r} out of place"
            seen.add(name)
        else:
            regular = True
            if name.lower() != name or name in _CONNECTION_SPECIFIC:
                return f"header {name.decode('latin-1')!r} is not allowed"
            if name == b"te" and value != b"trailers":
                return "te other than trailers"
    if trailers:
        return None
    if not {b":method", b":scheme", b":path"} <= seen:
        return "a request without :method, :scheme and :path"
    if not dict(headers)[b":path"]:
        return "an empty :path"
    return None


def _content_length(headers: list[tuple[bytes, bytes]]) -> int | None:
    """The declared body length; ``None`` without one, -1 for one that is not a number."""
    for name, value in headers:
        if name == b"content-length":
            return int(value) if value.isdigit() and len(value) < 16 else -1
    return None
