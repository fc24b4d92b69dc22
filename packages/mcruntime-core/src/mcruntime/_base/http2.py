"""HTTP/2's vocabulary (RFC 9113), shared by the watch client and the webhook server.

Both sides frame HTTP/2 themselves, each doing only what it needs (the client
opens GET streams and reads long responses; the webhook server reads short
POSTs and answers them). What they share is here: the frame and setting
numbers, the error codes and their names, how a frame is built and how its
padding is taken off.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

# hpack (which both sides use to code header blocks) logs every header it encodes or
# decodes at DEBUG. A watch's block holds its cluster's bearer token and an API server
# calling a webhook may send one too, so a process that turns on debug logging must not
# write them; and the calls cost a tenth of a webhook call's CPU even when nothing is written.
logging.getLogger("hpack").setLevel(logging.INFO)

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
"""What a client sends first on a connection that speaks HTTP/2."""

DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE = range(9)
CONTINUATION = 9

END_STREAM = 0x1
ACK = 0x1
END_HEADERS = 0x4
PADDED = 0x8
PRIORITY_FLAG = 0x20

HEADER_TABLE_SIZE, ENABLE_PUSH, MAX_CONCURRENT_STREAMS = 1, 2, 3
INITIAL_WINDOW_SIZE, MAX_FRAME_SIZE, MAX_HEADER_LIST_SIZE = 4, 5, 6

NO_ERROR, PROTOCOL_ERROR, INTERNAL_ERROR, FLOW_CONTROL_ERROR = 0x0, 0x1, 0x2, 0x3
STREAM_CLOSED, FRAME_SIZE_ERROR, REFUSED_STREAM, CANCEL, COMPRESSION_ERROR = 0x5, 0x6, 0x7, 0x8, 0x9
ENHANCE_YOUR_CALM = 0xB
ERROR_NAMES = (
    "NO_ERROR",
    "PROTOCOL_ERROR",
    "INTERNAL_ERROR",
    "FLOW_CONTROL_ERROR",
    "SETTINGS_TIMEOUT",
    "STREAM_CLOSED",
    "FRAME_SIZE_ERROR",
    "REFUSED_STREAM",
    "CANCEL",
    "COMPRESSION_ERROR",
    "CONNECT_ERROR",
    "ENHANCE_YOUR_CALM",
    "INADEQUATE_SECURITY",
    "HTTP_1_1_REQUIRED",
)

MAX_FRAME = 1 << 14
"""The largest frame a peer may send us: SETTINGS_MAX_FRAME_SIZE's default, never raised by either side."""
LAST_STREAM_ID = (1 << 31) - 1
"""The largest stream id, and the largest window (2^31 - 1)."""
DEFAULT_WINDOW = 65535
DEFAULT_TABLE_SIZE = 4096


def error_name(code: int) -> str:
    """An HTTP/2 error code as RFC 9113 names it."""
    return ERROR_NAMES[code] if 0 <= code < len(ERROR_NAMES) else f"error code {code}"


def frame(kind: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    """One frame: the 9-byte header, then ``payload`` (at most the peer's largest frame)."""
    return len(payload).to_bytes(3, "big") + bytes((kind, flags)) + stream_id.to_bytes(4, "big") + payload


def settings_payload(pairs: tuple[tuple[int, int], ...]) -> bytes:
    """A SETTINGS frame's payload: each setting's 2-byte id and 4-byte value."""
    return b"".join(ident.to_bytes(2, "big") + value.to_bytes(4, "big") for ident, value in pairs)


def unpadded(payload: bytes) -> bytes | None:
    """A PADDED frame's payload without its padding; ``None`` when the padding fills the frame."""
    if not payload or payload[0] >= len(payload):
        return None
    return payload[1 : len(payload) - payload[0]]


def split_frames(
    data: bytes,
    position: int,
    handle: Callable[[int, int, int, bytes], None],
    error: Callable[[str, int], Exception],
) -> int:
    """Call ``handle(kind, flags, stream_id, payload)`` for each whole frame from ``position`` on.

    Returns where the bytes of an incomplete frame begin (``len(data)`` when
    none is left). A frame over :data:`MAX_FRAME` raises ``error(message,
    FRAME_SIZE_ERROR)`` before its payload is waited for, so a peer cannot
    make us buffer more than one frame.
    """
    end = len(data)
    while end - position >= 9:
        length = int.from_bytes(data[position : position + 3], "big")
        if length > MAX_FRAME:
            raise error(f"a frame of {length} bytes, over the {MAX_FRAME} allowed", FRAME_SIZE_ERROR)
        if end - position - 9 < length:
            break
        kind, flags = data[position + 3], data[position + 4]
        stream_id = int.from_bytes(data[position + 5 : position + 9], "big") & LAST_STREAM_ID
        payload = data[position + 9 : position + 9 + length]
        position += 9 + length
        handle(kind, flags, stream_id, payload)
    return position
