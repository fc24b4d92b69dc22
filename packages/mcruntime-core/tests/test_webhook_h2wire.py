"""The webhook server's HTTP/2 framing (``_webhook/h2wire.py``) against h2's client side, and hostile bytes.

h2's client connection is the reference: whatever it sends the wire must
read, and whatever the wire answers it must accept. The hostile cases build
frames by hand and check each is refused with an error naming the fault and
the HTTP/2 code the connection closes with.
"""

from __future__ import annotations

import re
from typing import Any

import h2.config
import h2.connection
import h2.events
import h2.settings
import hpack
import pytest

from mcruntime._base.http2 import (
    CANCEL,
    CONTINUATION,
    DATA,
    ENHANCE_YOUR_CALM,
    FLOW_CONTROL_ERROR,
    FRAME_SIZE_ERROR,
    GOAWAY,
    HEADERS,
    NO_ERROR,
    PREFACE,
    PROTOCOL_ERROR,
    PUSH_PROMISE,
    REFUSED_STREAM,
    RST_STREAM,
    SETTINGS,
    WINDOW_UPDATE,
    frame,
)
from mcruntime._webhook.h2wire import ProtocolViolation, ServerWire

REQUEST = [
    (b":method", b"POST"),
    (b":scheme", b"https"),
    (b":authority", b"127.0.0.1:9443"),
    (b":path", b"/clusters/east/validate/core/v1/ConfigMap"),
    (b"content-type", b"application/json"),
]


class Heard:
    """A listener that records what the wire reports, in order."""

    def __init__(self) -> None:
        self.events: list[tuple[Any, ...]] = []

    def on_request(self, stream_id: int, headers: list[tuple[bytes, bytes]], ended: bool) -> None:
        self.events.append(("request", stream_id, dict(headers)[b":path"], ended))

    def on_body(self, stream_id: int, data: bytes) -> None:
        self.events.append(("body", stream_id, data))

    def on_end(self, stream_id: int) -> None:
        self.events.append(("end", stream_id))

    def on_reset(self, stream_id: int, code: int) -> None:
        self.events.append(("reset", stream_id, code))

    def on_goaway(self, code: int) -> None:
        self.events.append(("goaway", code))

    def take(self) -> list[tuple[Any, ...]]:
        events, self.events = self.events, []
        return events


class Pair:
    """h2's client connected to our server wire, bytes carried by hand."""

    def __init__(self, *, max_streams: int = 8, client_window: int | None = None) -> None:
        self.heard = Heard()
        self.wire = ServerWire(
            self.heard, max_streams=max_streams, stream_window=1 << 16, max_header_block=4096
        )
        self.client = h2.connection.H2Connection(
            h2.config.H2Configuration(client_side=True, header_encoding=None)
        )
        if client_window is not None:
            self.client.local_settings = h2.settings.Settings(
                client=True, initial_values={h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: client_window}
            )
        self.client.initiate_connection()
        self.wire.initiate()
        self.to_server()
        self.to_client()
        self.to_server()  # the client's acknowledgement of our SETTINGS

    def to_server(self, data: bytes | None = None) -> list[tuple[Any, ...]]:
        self.wire.receive(self.client.data_to_send() if data is None else data)
        return self.heard.take()

    def to_client(self) -> list[h2.events.Event]:
        return self.client.receive_data(self.wire.data_to_send())

    def post(self, body: bytes) -> int:
        stream_id = self.client.get_next_available_stream_id()
        self.client.send_headers(stream_id, REQUEST)
        self.client.send_data(stream_id, body, end_stream=True)
        return stream_id


def answer(events: list[h2.events.Event], stream_id: int) -> tuple[int, bytes, bool]:
    """The status, the body and whether the stream ended, as the client saw them."""
    status, body, ended = 0, b"", False
    for event in events:
        if isinstance(event, h2.events.ResponseReceived) and event.stream_id == stream_id:
            status = int(dict(event.headers)[b":status"])
        elif isinstance(event, h2.events.DataReceived) and event.stream_id == stream_id:
            body += event.data
        elif isinstance(event, h2.events.StreamEnded) and event.stream_id == stream_id:
            ended = True
    return status, body, ended


def test_a_post_is_heard_and_answered_and_the_settings_are_ours() -> None:
    pair = Pair(max_streams=8)
    assert pair.client.remote_settings.max_concurrent_streams == 8
    assert pair.client.remote_settings.initial_window_size == 1 << 16
    stream_id = pair.post(b'{"a": 1}')
    assert pair.to_server() == [
        ("request", stream_id, REQUEST[3][1], False),
        ("body", stream_id, b'{"a": 1}'),
        ("end", stream_id),
    ]
    pair.wire.respond(stream_id, 200, [(b"content-type", b"application/json")], b'{"ok": true}')
    assert answer(pair.to_client(), stream_id) == (200, b'{"ok": true}', True)
    assert pair.wire.open_streams == 0


def test_a_response_larger_than_the_clients_window_waits_for_its_window_update() -> None:
    pair = Pair(client_window=1000)
    stream_id = pair.post(b"{}")
    pair.to_server()
    body = bytes(range(256)) * 20  # 5,120 bytes against a window of 1,000
    pair.wire.respond(stream_id, 200, [], body)
    got = b""
    for _ in range(10):
        events = pair.to_client()
        for event in events:
            if isinstance(event, h2.events.DataReceived):
                got += event.data
                pair.client.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
        if any(isinstance(event, h2.events.StreamEnded) for event in events):
            break
        assert len(got) % 1000 == 0  # never more than the window at a time
        pair.to_server()
    assert got == body
    assert pair.wire.open_streams == 0


def test_an_answer_before_the_body_ended_resets_the_stream_without_error() -> None:
    pair = Pair()
    stream_id = pair.client.get_next_available_stream_id()
    pair.client.send_headers(stream_id, REQUEST)
    pair.client.send_data(stream_id, b"{")
    pair.to_server()
    pair.wire.respond(stream_id, 413, [], b"too large\n")
    events = pair.to_client()
    assert answer(events, stream_id) == (413, b"too large\n", True)
    assert [e.error_code for e in events if isinstance(e, h2.events.StreamReset)] == [NO_ERROR]
    assert pair.wire.open_streams == 0


def test_streams_over_the_limit_are_refused_and_cost_no_request() -> None:
    pair = Pair(max_streams=2)
    opened = []
    for _ in range(2):
        opened.append(pair.client.get_next_available_stream_id())
        pair.client.send_headers(opened[-1], REQUEST)
    # h2 keeps to our limit; a client that does not, by hand (a block of its own coder, static-only).
    opened.append(opened[-1] + 2)
    heard = pair.to_server(pair.client.data_to_send() + frame(HEADERS, 0x4, opened[-1], _block(REQUEST)))
    assert [event[1] for event in heard if event[0] == "request"] == opened[:2]
    # (h2 would take a reset of a stream it never opened as an error: the bytes are read here)
    assert pair.wire.data_to_send() == frame(RST_STREAM, 0, opened[2], REFUSED_STREAM.to_bytes(4, "big"))


def test_a_reset_from_the_client_is_heard_and_its_answer_is_dropped() -> None:
    pair = Pair()
    stream_id = pair.post(b"{}")
    pair.to_server()
    pair.client.reset_stream(stream_id, error_code=0x8)
    assert pair.to_server() == [("reset", stream_id, 0x8)]
    pair.wire.respond(stream_id, 200, [], b"late")
    assert pair.wire.data_to_send() == b""


def test_a_ping_is_answered_and_trailers_end_a_request() -> None:
    pair = Pair()
    pair.client.ping(b"12345678")
    pair.to_server()
    assert [e.ping_data for e in pair.to_client() if isinstance(e, h2.events.PingAckReceived)] == [
        b"12345678"
    ]
    stream_id = pair.client.get_next_available_stream_id()
    pair.client.send_headers(stream_id, REQUEST)
    pair.client.send_data(stream_id, b"{}")
    pair.client.send_headers(stream_id, [(b"x-trailer", b"1")], end_stream=True)
    assert pair.to_server()[-1] == ("end", stream_id)


def test_a_goaway_sent_ignores_later_streams_and_names_the_last() -> None:
    pair = Pair()
    first = pair.post(b"{}")
    pair.to_server()
    pair.wire.goaway()
    [goaway] = [e for e in pair.to_client() if isinstance(e, h2.events.ConnectionTerminated)]
    assert (goaway.error_code, goaway.last_stream_id) == (NO_ERROR, first)


def test_a_call_racing_our_goaway_is_dropped_whole_and_the_calls_before_it_are_still_answered() -> None:
    pair = Pair()
    first = pair.post(b"{}")
    assert [event[0] for event in pair.to_server()] == ["request", "body", "end"]
    pair.wire.goaway()
    late = pair.post(b'{"late": true}')  # sent before our GOAWAY arrived: HEADERS, then DATA
    assert pair.to_server() == []  # neither frame is the client's fault, and the owner hears of neither
    pair.to_server(frame(RST_STREAM, 0, late, CANCEL.to_bytes(4, "big")))
    pair.wire.respond(first, 200, [], b"answered")
    pair.wire.goaway(PROTOCOL_ERROR)  # a later GOAWAY may not name a later stream (RFC 9113 6.8)
    # h2's client takes no frame after a GOAWAY, so the frames are read by hand.
    sent = _frames(pair.wire.data_to_send())
    assert [(kind, stream) for kind, stream, _ in sent] == [
        (GOAWAY, 0),
        (HEADERS, first),
        (DATA, first),
        (GOAWAY, 0),
    ]
    assert sent[2][2] == b"answered"
    assert [payload[:8] for kind, _, payload in sent if kind == GOAWAY] == [
        first.to_bytes(4, "big") + NO_ERROR.to_bytes(4, "big"),
        first.to_bytes(4, "big") + PROTOCOL_ERROR.to_bytes(4, "big"),
    ]


def test_late_data_for_a_stream_we_refused_long_ago_is_dropped_not_a_fault() -> None:
    """A body still arriving after more calls ended than the wire remembers (128) costs nothing."""
    pair = Pair()
    refused = pair.client.get_next_available_stream_id()
    pair.client.send_headers(refused, REQUEST)
    assert [event[0] for event in pair.to_server()] == ["request"]
    pair.wire.reset(refused, REFUSED_STREAM)  # its body is too large, say: the rest is not wanted
    pair.to_client()
    for _ in range(130):  # calls that come and go meanwhile
        stream = pair.post(b"{}")
        pair.to_server()
        pair.wire.respond(stream, 200, [], b"ok")
        pair.to_client()
    late = frame(DATA, 0, refused, b"more of the refused body")
    assert pair.to_server(late) == []
    closed = pair.post(b"{}")  # a stream that ended normally, still remembered: DATA on it is a fault
    pair.to_server()
    pair.wire.respond(closed, 200, [], b"ok")
    pair.to_client()
    with pytest.raises(ProtocolViolation, match=f"DATA on stream {closed}, which is closed"):
        pair.to_server(frame(DATA, 0, closed, b"x"))


def _frames(data: bytes) -> list[tuple[int, int, bytes]]:
    """(type, stream, payload) of each frame in ``data``."""
    found, position = [], 0
    while position < len(data):
        length = int.from_bytes(data[position : position + 3], "big")
        kind, stream = data[position + 3], int.from_bytes(data[position + 5 : position + 9], "big")
        found.append((kind, stream, data[position + 9 : position + 9 + length]))
        position += 9 + length
    return found


def _settled() -> tuple[ServerWire, Heard]:
    heard = Heard()
    wire = ServerWire(heard, max_streams=4, stream_window=1 << 16, max_header_block=4096)
    wire.initiate()
    wire.receive(PREFACE + frame(SETTINGS, 0, 0))
    return wire, heard


def _block(headers: list[tuple[bytes, bytes]]) -> bytes:
    return bytes(hpack.Encoder().encode(headers))


HOSTILE: list[tuple[str, bytes, str, int]] = [
    (
        "not http/2",
        b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
        "did not begin with HTTP/2's preface",
        PROTOCOL_ERROR,
    ),
    (
        "no settings first",
        PREFACE + frame(WINDOW_UPDATE, 0, 0, b"\0\0\0\1"),
        "first frame was not SETTINGS",
        PROTOCOL_ERROR,
    ),
]
AFTER_SETTINGS: list[tuple[str, bytes, str, int]] = [
    (
        "a frame too large",
        (1 << 14 | 1).to_bytes(3, "big") + bytes(6),
        "over the 16384 allowed",
        FRAME_SIZE_ERROR,
    ),
    (
        "push promise",
        frame(PUSH_PROMISE, 0x4, 1, b"\0\0\0\2"),
        "a PUSH_PROMISE from a client",
        PROTOCOL_ERROR,
    ),
    ("even stream", frame(HEADERS, 0x5, 2, _block(REQUEST)), "an even (server's) id", PROTOCOL_ERROR),
    (
        "data unopened",
        frame(DATA, 0, 9, b"x"),
        "DATA on stream 9, which the client never opened",
        PROTOCOL_ERROR,
    ),
    ("window of zero", frame(WINDOW_UPDATE, 0, 0, b"\0\0\0\0"), "a WINDOW_UPDATE of 0", PROTOCOL_ERROR),
    (
        "window overflow",
        frame(WINDOW_UPDATE, 0, 0, b"\x7f\xff\xff\xff"),
        "window over 2^31-1",
        FLOW_CONTROL_ERROR,
    ),
    (
        "settings on a stream",
        frame(SETTINGS, 0, 1),
        "connection-level frame (type 4) on stream 1",
        PROTOCOL_ERROR,
    ),
    ("bad settings", frame(SETTINGS, 0, 0, b"\0\4\0"), "a SETTINGS frame of 3 bytes", FRAME_SIZE_ERROR),
    ("bad header block", frame(HEADERS, 0x5, 1, b"\xff\xff\xff\xff"), "does not decode", 0x9),
    (
        "headers, then not continuation",
        frame(HEADERS, 0, 1, b"") + frame(DATA, 0, 1, b""),
        "came between",
        PROTOCOL_ERROR,
    ),
]


@pytest.mark.parametrize(
    ("data", "message", "code"), [case[1:] for case in HOSTILE], ids=[case[0] for case in HOSTILE]
)
def test_a_broken_start_is_refused(data: bytes, message: str, code: int) -> None:
    wire = ServerWire(Heard(), max_streams=4, stream_window=1 << 16, max_header_block=4096)
    with pytest.raises(ProtocolViolation, match=re.escape(message)) as caught:
        wire.receive(data)
    assert caught.value.code == code


@pytest.mark.parametrize(
    ("data", "message", "code"),
    [case[1:] for case in AFTER_SETTINGS],
    ids=[case[0] for case in AFTER_SETTINGS],
)
def test_hostile_frames_are_refused_with_a_named_fault(data: bytes, message: str, code: int) -> None:
    wire, _heard = _settled()
    with pytest.raises(ProtocolViolation, match=re.escape(message)) as caught:
        wire.receive(data)
    assert caught.value.code == code


def test_a_body_over_the_streams_window_is_a_flow_control_error() -> None:
    heard = Heard()
    wire = ServerWire(heard, max_streams=4, stream_window=1000, max_header_block=4096)
    wire.initiate()
    wire.receive(PREFACE + frame(SETTINGS, 0, 0) + frame(HEADERS, 0x4, 1, _block(REQUEST)))
    assert heard.take()[0][0] == "request"
    with pytest.raises(ProtocolViolation, match="more than stream 1's window") as caught:
        wire.receive(frame(DATA, 0, 1, bytes(1001)))
    assert caught.value.code == FLOW_CONTROL_ERROR


def test_a_header_block_too_large_or_in_too_many_pieces_is_refused() -> None:
    wire, _ = _settled()
    with pytest.raises(ProtocolViolation, match="a header block over 4096 bytes"):
        wire.receive(frame(HEADERS, 0, 1, b"") + frame(CONTINUATION, 0, 1, bytes(4097)))
    wire, _ = _settled()
    flood = frame(HEADERS, 0, 1, b"") + frame(CONTINUATION, 0, 1, b"") * 100
    with pytest.raises(ProtocolViolation, match="more than 64 CONTINUATION frames") as caught:
        wire.receive(flood)
    assert caught.value.code == ENHANCE_YOUR_CALM
