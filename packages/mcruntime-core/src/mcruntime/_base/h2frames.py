"""Reading an HTTP/2 peer's frames: the part both sides (watch client, webhook server) share.

:class:`FrameReader` buffers the peer's bytes, cuts them into frames, checks
what RFC 9113 requires of every frame whichever side reads it (SETTINGS first,
connection frames on stream 0, frame lengths, padding, header blocks and their
CONTINUATION frames within bounds, SETTINGS values, PING and GOAWAY shapes),
answers SETTINGS and PING, and hands each frame's meaning to its subclass.
What differs by side (which streams exist, flow control, what a header block
means) is the subclass's.
"""

from __future__ import annotations

from collections.abc import Callable

from .http2 import (
    ACK,
    CONTINUATION,
    DATA,
    ENABLE_PUSH,
    END_HEADERS,
    ENHANCE_YOUR_CALM,
    FLOW_CONTROL_ERROR,
    FRAME_SIZE_ERROR,
    GOAWAY,
    HEADERS,
    INITIAL_WINDOW_SIZE,
    LAST_STREAM_ID,
    MAX_FRAME,
    MAX_FRAME_SIZE,
    PADDED,
    PING,
    PRIORITY,
    PRIORITY_FLAG,
    PROTOCOL_ERROR,
    PUSH_PROMISE,
    RST_STREAM,
    SETTINGS,
    WINDOW_UPDATE,
    frame,
    split_frames,
    unpadded,
)

SELF_DEPENDENT = 0x100
"""Not a wire flag: set on a HEADERS whose priority names its own stream (a fault the reader may punish)."""
MAX_CONTINUATIONS = 64
"""CONTINUATION frames one header block may take (empty ones would otherwise cost nothing to send)."""
MAX_ACK_BACKLOG = 1 << 20
"""Bytes of ours the peer has left unread above which its PINGs and SETTINGS count towards a flood.

Each PING and SETTINGS must be acknowledged; a peer that sends them and never
reads would have our acknowledgements pile up without end (CVE-2019-9512,
CVE-2019-9515). Read at each frame, so a test may lower it.
"""
MAX_ACKS_BACKLOGGED = 1000
"""PINGs and SETTINGS to acknowledge while over :data:`MAX_ACK_BACKLOG` before the connection is refused.

A few may come while a burst of our own (many watches opening at once) waits
to be sent; thousands are a flood.
"""


class FrameReader:
    """One side's reading of an HTTP/2 connection; subclasses give each frame its meaning.

    ``error(message, code)`` builds the exception a fault raises (the owner
    closes the connection with GOAWAY ``code``); ``peer`` names the other side
    in messages. ``backlog`` tells how many bytes the owner has written and
    the peer not yet read (its transport's write buffer): the acknowledgements
    queued here are only what one read brings, the pile-up of a peer that
    never reads is there.
    """

    def __init__(
        self,
        *,
        error: Callable[[str, int], Exception],
        peer: str,
        max_header_block: int,
        backlog: Callable[[], int] | None = None,
    ) -> None:
        self._error = error
        self._backlog = backlog
        self._acks_backlogged = 0
        self._peer = peer
        self._max_header_block = max_header_block
        self._out = bytearray()
        self._in = bytearray()
        self._settled = False
        self._continuing: tuple[int, int, bytearray, int] | None = None
        """A header block waiting for CONTINUATION: stream, first frame's flags, bytes, frames so far."""
        self._max_frame_out = MAX_FRAME

    def data_to_send(self) -> bytes:
        if not self._out:
            return b""
        data = bytes(self._out)
        self._out.clear()
        return data

    def receive(self, data: bytes) -> None:
        """Parse the peer's bytes and act on each whole frame; raises what ``error`` builds."""
        if self._in:
            self._in += data
            data = bytes(self._in)
            self._in.clear()
        self._frames(data, 0)

    def _frames(self, data: bytes, position: int) -> None:
        position = split_frames(data, position, self._receive_frame, self._error)
        if position < len(data):
            self._in += data[position:]

    def _fault(self, message: str, code: int = PROTOCOL_ERROR) -> Exception:
        return self._error(message, code)

    def _receive_frame(self, kind: int, flags: int, stream_id: int, payload: bytes) -> None:
        if not self._settled:
            if kind != SETTINGS or flags & ACK:
                raise self._fault(f"the {self._peer}'s first frame was not SETTINGS")
            self._settled = True
        if self._continuing is not None and kind != CONTINUATION:
            raise self._fault("a frame came between a header block's HEADERS and its CONTINUATION")
        if kind == DATA:
            self._data(flags, stream_id, payload)
        elif kind == HEADERS:
            self._headers(flags, stream_id, payload)
        elif kind == CONTINUATION:
            self._continuation(flags, stream_id, payload)
        elif kind in (SETTINGS, PING, GOAWAY):
            if stream_id != 0:
                raise self._fault(f"a connection-level frame (type {kind}) on stream {stream_id}")
            if kind == SETTINGS:
                self._settings(flags, payload)
            elif kind == PING:
                self._ping(flags, payload)
            else:
                self._goaway(payload)
        elif kind == RST_STREAM:
            if len(payload) != 4:
                raise self._fault(f"an RST_STREAM of {len(payload)} bytes", FRAME_SIZE_ERROR)
            self._rst_stream(stream_id, int.from_bytes(payload, "big"))
        elif kind == WINDOW_UPDATE:
            if len(payload) != 4:
                raise self._fault(f"a WINDOW_UPDATE of {len(payload)} bytes", FRAME_SIZE_ERROR)
            self._window_update(stream_id, int.from_bytes(payload, "big") & LAST_STREAM_ID)
        elif kind == PUSH_PROMISE:
            raise self._fault(self._push_refusal())
        elif kind == PRIORITY:
            if stream_id == 0:
                raise self._fault("a PRIORITY frame on stream 0")
            if len(payload) != 5:
                raise self._fault(f"a PRIORITY frame of {len(payload)} bytes", FRAME_SIZE_ERROR)
            if int.from_bytes(payload[:4], "big") & LAST_STREAM_ID == stream_id:
                self._self_dependent(stream_id)
        # Frame types this side does not know are ignored (RFC 9113 4.1, 5.5).

    def _unpadded(self, payload: bytes, what: str) -> bytes:
        stripped = unpadded(payload)
        if stripped is None:
            raise self._fault(f"a padded {what} frame whose padding is as long as the frame")
        return stripped

    def _headers(self, flags: int, stream_id: int, payload: bytes) -> None:
        if stream_id == 0:
            raise self._fault("HEADERS on stream 0")
        if flags & PADDED:
            payload = self._unpadded(payload, "HEADERS")
        if flags & PRIORITY_FLAG:
            if len(payload) < 5:
                raise self._fault("HEADERS too short for its priority", FRAME_SIZE_ERROR)
            if int.from_bytes(payload[:4], "big") & LAST_STREAM_ID == stream_id:
                flags |= SELF_DEPENDENT  # decoded first (the table must move), then the subclass decides
            payload = payload[5:]
        if flags & END_HEADERS:
            self._header_block(stream_id, flags, payload)
        else:
            self._continuing = (stream_id, flags, bytearray(payload), 0)

    def _continuation(self, flags: int, stream_id: int, payload: bytes) -> None:
        if self._continuing is None or self._continuing[0] != stream_id:
            raise self._fault(f"a CONTINUATION on stream {stream_id} that continues no header block")
        _, first_flags, block, count = self._continuing
        block += payload
        if len(block) > self._max_header_block:
            raise self._fault(f"a header block over {self._max_header_block} bytes")
        if count >= MAX_CONTINUATIONS:
            raise self._fault(
                f"a header block in more than {MAX_CONTINUATIONS} CONTINUATION frames", ENHANCE_YOUR_CALM
            )
        if flags & END_HEADERS:
            self._continuing = None
            self._header_block(stream_id, first_flags, bytes(block))
        else:
            self._continuing = (stream_id, first_flags, block, count + 1)

    def _settings(self, flags: int, payload: bytes) -> None:
        if flags & ACK:
            if payload:
                raise self._fault("a SETTINGS acknowledgement with a payload", FRAME_SIZE_ERROR)
            return
        if len(payload) % 6:
            raise self._fault(f"a SETTINGS frame of {len(payload)} bytes", FRAME_SIZE_ERROR)
        for offset in range(0, len(payload), 6):
            ident = int.from_bytes(payload[offset : offset + 2], "big")
            value = int.from_bytes(payload[offset + 2 : offset + 6], "big")
            if ident == INITIAL_WINDOW_SIZE and value > LAST_STREAM_ID:
                raise self._fault(f"SETTINGS_INITIAL_WINDOW_SIZE {value}", FLOW_CONTROL_ERROR)
            if ident == MAX_FRAME_SIZE:
                if not MAX_FRAME <= value < 1 << 24:
                    raise self._fault(f"SETTINGS_MAX_FRAME_SIZE {value}")
                self._max_frame_out = value
            elif ident == ENABLE_PUSH and value > 1:
                raise self._fault(f"SETTINGS_ENABLE_PUSH {value}")
            self._setting(ident, value)
        self._owe_ack("SETTINGS")
        self._out += frame(SETTINGS, ACK, 0)
        self._settings_applied()

    def _ping(self, flags: int, payload: bytes) -> None:
        if len(payload) != 8:
            raise self._fault(f"a PING of {len(payload)} bytes", FRAME_SIZE_ERROR)
        if flags & ACK:
            self._ping_acknowledged()
        else:
            self._owe_ack("PING")
            self._out += frame(PING, ACK, 0, payload)

    def _owe_ack(self, what: str) -> None:
        """Refuse a peer whose frames to acknowledge keep coming while it leaves our bytes unread.

        Counted only while our unsent bytes are over the bound, and from zero
        each time they fall below it: a peer that reads may ping as it likes.
        """
        waiting = len(self._out) + (self._backlog() if self._backlog is not None else 0)
        if waiting <= MAX_ACK_BACKLOG:
            self._acks_backlogged = 0
            return
        self._acks_backlogged += 1
        if self._acks_backlogged > MAX_ACKS_BACKLOGGED:
            raise self._fault(
                f"a {what} flood: over {MAX_ACKS_BACKLOGGED} PING or SETTINGS frames to acknowledge "
                f"while {waiting} bytes of ours waited for the {self._peer} to read them",
                ENHANCE_YOUR_CALM,
            )

    def _goaway(self, payload: bytes) -> None:
        if len(payload) < 8:
            raise self._fault(f"a GOAWAY of {len(payload)} bytes", FRAME_SIZE_ERROR)
        last = int.from_bytes(payload[:4], "big") & LAST_STREAM_ID
        self._peer_goaway(last, int.from_bytes(payload[4:8], "big"))

    # --- what each side decides -------------------------------------------------------

    def _data(self, flags: int, stream_id: int, payload: bytes) -> None:
        raise NotImplementedError

    def _header_block(self, stream_id: int, flags: int, block: bytes) -> None:
        raise NotImplementedError

    def _rst_stream(self, stream_id: int, code: int) -> None:
        raise NotImplementedError

    def _window_update(self, stream_id: int, increment: int) -> None:
        raise NotImplementedError

    def _push_refusal(self) -> str:
        raise NotImplementedError

    def _setting(self, ident: int, value: int) -> None:
        """One setting of the peer's, after the checks every side makes."""

    def _settings_applied(self) -> None:
        """The peer's SETTINGS frame was applied and acknowledged."""

    def _ping_acknowledged(self) -> None:
        """Our PING was answered."""

    def _peer_goaway(self, last_stream_id: int, code: int) -> None:
        """The peer opens nothing more (``last_stream_id`` is the last of ours it handled)."""

    def _self_dependent(self, stream_id: int) -> None:
        """A PRIORITY frame names its own stream as its parent (RFC 9113 5.3.1)."""
