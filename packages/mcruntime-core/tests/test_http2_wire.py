"""Our HTTP/2 client framing (``_client/wire.py``) against h2's server side, and against hostile bytes.

h2's server connection is the reference here: it must accept everything the
wire sends, and the wire must read everything it answers with. The hostile
cases build frames by hand and check that each is refused with an error that
names what was wrong, and the HTTP/2 error code the connection closes with.
"""

from __future__ import annotations

from typing import Any

import h2.config
import h2.connection
import h2.events
import h2.settings
import hpack
import pytest

from mcruntime._client.wire import (
    CANCEL,
    COMPRESSION_ERROR,
    FLOW_CONTROL_ERROR,
    FRAME_SIZE_ERROR,
    MAX_HEADER_BLOCK,
    PROTOCOL_ERROR,
    Wire,
    WireError,
    error_name,
)

WINDOW = 1 << 16
REQUEST = [(b":method", b"GET"), (b":scheme", b"https"), (b":authority", b"server:6443"), (b":path", b"/w")]


class Heard:
    """A listener that records what the wire reports, in order."""

    def __init__(self) -> None:
        self.events: list[tuple[Any, ...]] = []

    def on_settings(self) -> None:
        self.events.append(("settings",))

    def on_response(self, stream_id: int, status: int, headers: list[tuple[bytes, bytes]]) -> None:
        self.events.append(("response", stream_id, status, dict(headers)))

    def on_data(self, stream_id: int, data: bytes, flowed: int) -> None:
        self.events.append(("data", stream_id, data, flowed))

    def on_end(self, stream_id: int) -> None:
        self.events.append(("end", stream_id))

    def on_reset(self, stream_id: int, code: int) -> None:
        self.events.append(("reset", stream_id, code))

    def on_ping_ack(self) -> None:
        self.events.append(("ping-ack",))

    def on_goaway(self, last_stream_id: int, code: int) -> None:
        self.events.append(("goaway", last_stream_id, code))

    def take(self) -> list[tuple[Any, ...]]:
        events, self.events = self.events, []
        return events


class Pair:
    """Our client wire connected to h2's server side, bytes carried by hand."""

    def __init__(self) -> None:
        self.heard = Heard()
        self.wire = Wire(self.heard, stream_window=WINDOW, connection_window=(1 << 31) - 1)
        config = h2.config.H2Configuration(client_side=False, header_encoding=None)
        self.server = h2.connection.H2Connection(config)
        self.server.initiate_connection()
        self.wire.initiate()
        self.to_server()
        self.to_client()
        self.to_server()  # our SETTINGS acknowledgement

    def to_server(self) -> list[h2.events.Event]:
        return self.server.receive_data(self.wire.data_to_send())

    def to_client(self, data: bytes | None = None) -> list[tuple[Any, ...]]:
        self.wire.receive(self.server.data_to_send() if data is None else data)
        return self.heard.take()

    def open(self) -> int:
        stream_id = self.wire.open_stream(REQUEST)
        [request] = [e for e in self.to_server() if isinstance(e, h2.events.RequestReceived)]
        assert request.stream_id == stream_id
        return stream_id


def frame(kind: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    return len(payload).to_bytes(3, "big") + bytes((kind, flags)) + stream_id.to_bytes(4, "big") + payload


def test_a_watch_is_requested_answered_streamed_and_ended() -> None:
    pair = Pair()
    stream_id = pair.open()
    pair.server.send_headers(stream_id, [(b":status", b"200"), (b"content-type", b"application/json")])
    pair.server.send_data(stream_id, b'{"type":"ADDED"}\n')
    pair.server.send_data(stream_id, b'{"type":"MODIFIED"}\n', end_stream=True)
    assert pair.to_client() == [
        ("response", stream_id, 200, {b":status": b"200", b"content-type": b"application/json"}),
        ("data", stream_id, b'{"type":"ADDED"}\n', 17),
        ("data", stream_id, b'{"type":"MODIFIED"}\n', 20),
        ("end", stream_id),
    ]


def test_the_handshake_reports_the_servers_settings_and_acknowledges_them() -> None:
    heard = Heard()
    wire = Wire(heard, stream_window=WINDOW, connection_window=(1 << 31) - 1)
    server = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False))
    server.local_settings = h2.settings.Settings(
        client=False, initial_values={h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS: 7}
    )
    server.initiate_connection()
    wire.initiate()
    events = server.receive_data(wire.data_to_send())
    changed = [e for e in events if isinstance(e, h2.events.RemoteSettingsChanged)]
    assert (
        changed
        and changed[0].changed_settings[h2.settings.SettingCodes.INITIAL_WINDOW_SIZE].new_value == WINDOW
    )
    assert server.remote_settings.enable_push == 0
    wire.receive(server.data_to_send())
    assert heard.take() == [("settings",)]
    assert wire.max_concurrent_streams == 7
    acked = server.receive_data(wire.data_to_send())
    assert any(isinstance(e, h2.events.SettingsAcknowledged) for e in acked)


def test_a_padded_response_with_continuation_and_an_interim_status_is_read() -> None:
    pair = Pair()
    stream_id = pair.open()
    encoder = pair.server.encoder
    interim = encoder.encode([(b":status", b"100")])
    block = encoder.encode([(b":status", b"200"), (b"x-long", b"v" * 40)])
    padded = bytes((3,)) + block[:10] + b"\0\0\0"
    data = (
        frame(1, 0x4, stream_id, interim)  # HEADERS 100, END_HEADERS
        + frame(1, 0x8, stream_id, padded)  # HEADERS, PADDED, no END_HEADERS
        + frame(9, 0x4, stream_id, block[10:])  # CONTINUATION, END_HEADERS
        + frame(0, 0x8 | 0x1, stream_id, bytes((2,)) + b"event\n" + b"\0\0")  # DATA, PADDED, END_STREAM
    )
    events = pair.to_client(data)
    assert events[0][:3] == ("response", stream_id, 200) and events[0][3][b"x-long"] == b"v" * 40
    assert events[1:] == [("data", stream_id, b"event\n", 9), ("end", stream_id)]


def test_bytes_split_anywhere_give_the_same_frames() -> None:
    pair = Pair()
    stream_id = pair.open()
    pair.server.send_headers(stream_id, [(b":status", b"200")])
    for index in range(5):
        pair.server.send_data(stream_id, f"event-{index}\n".encode())
    raw = pair.server.data_to_send()
    for size in (1, 2, 7, 9, 10, 33):
        second = Pair()
        second_id = second.open()
        assert second_id == stream_id
        heard: list[tuple[Any, ...]] = []
        for offset in range(0, len(raw), size):
            heard += second.to_client(raw[offset : offset + size])
        assert [event[2] for event in heard if event[0] == "data"] == [
            f"event-{i}\n".encode() for i in range(5)
        ]


def test_windows_reopen_once_half_was_read_and_never_beyond() -> None:
    pair = Pair()
    stream_id = pair.open()
    pair.server.send_headers(stream_id, [(b":status", b"200")])
    chunk = b"x" * 1000
    sent = 0
    while pair.server.local_flow_control_window(stream_id) >= len(chunk):
        pair.server.send_data(stream_id, chunk)
        sent += len(chunk)
    events = pair.to_client()
    assert sum(event[3] for event in events if event[0] == "data") == sent
    for _ in range(sent // 1000):
        pair.wire.consumed(stream_id, 1000)
    updates = [e for e in pair.to_server() if isinstance(e, h2.events.WindowUpdated)]
    assert [u.stream_id for u in updates] == [
        stream_id
    ]  # one update for the stream, none for the connection yet
    assert pair.server.local_flow_control_window(stream_id) > WINDOW // 2


def test_a_reset_stream_drops_late_frames_but_keeps_decoding_their_headers() -> None:
    pair = Pair()
    first = pair.open()
    second = pair.open()
    pair.wire.reset(first, CANCEL)
    resets = [e for e in pair.to_server() if isinstance(e, h2.events.StreamReset)]
    assert [(r.stream_id, r.error_code) for r in resets] == [(first, CANCEL)]
    # A server that answered before it saw the reset: its frames for the first stream arrive anyway.
    encoder = pair.server.encoder
    late = frame(1, 0x4, first, encoder.encode([(b":status", b"200"), (b"x-new", b"indexed")]))
    late += frame(0, 0, first, b"late\n")
    answer = frame(1, 0x4, second, encoder.encode([(b":status", b"200"), (b"x-new", b"indexed")]))
    events = pair.to_client(late + answer)
    assert events == [("response", second, 200, {b":status": b"200", b"x-new": b"indexed"})]


def test_ping_goaway_and_a_servers_reset_are_reported() -> None:
    pair = Pair()
    stream_id = pair.open()
    pair.wire.ping(b"12345678")
    assert any(isinstance(e, h2.events.PingReceived) for e in pair.to_server())
    pair.server.reset_stream(stream_id, 2)
    pair.server.close_connection(error_code=0, last_stream_id=stream_id)
    assert pair.to_client() == [("ping-ack",), ("reset", stream_id, 2), ("goaway", stream_id, 0)]
    assert error_name(2) == "INTERNAL_ERROR" and error_name(99) == "error code 99"


def test_a_servers_ping_is_answered() -> None:
    pair = Pair()
    pair.server.ping(b"abcdefgh")
    assert pair.to_client() == []
    acks = [e for e in pair.to_server() if isinstance(e, h2.events.PingAckReceived)]
    assert [a.ping_data for a in acks] == [b"abcdefgh"]


def test_a_long_request_header_block_goes_out_in_continuation_frames() -> None:
    pair = Pair()
    headers = [*REQUEST, (b"authorization", b"Bearer " + b"t" * 40_000)]
    stream_id = pair.wire.open_stream(headers)
    [request] = [e for e in pair.to_server() if isinstance(e, h2.events.RequestReceived)]
    assert request.stream_id == stream_id
    assert dict(request.headers or [])[b"authorization"] == headers[-1][1]


HOSTILE = [
    (
        "an oversized frame",
        frame(0, 0, 1, b"x" * ((1 << 14) + 1)),
        "over the 16384 allowed",
        FRAME_SIZE_ERROR,
    ),
    ("a push promise", frame(5, 0x4, 1, b"\0\0\0\2"), "PUSH_PROMISE", PROTOCOL_ERROR),
    ("DATA on stream 0", frame(0, 0, 0, b"x"), "DATA on stream 0", PROTOCOL_ERROR),
    ("DATA on a stream never opened", frame(0, 0, 99, b"x"), "never opened", PROTOCOL_ERROR),
    ("DATA on a server's stream", frame(0, 0, 2, b"x"), "never opened", PROTOCOL_ERROR),
    ("padding longer than the frame", frame(0, 0x8, 1, bytes((9,)) + b"ab"), "padding", PROTOCOL_ERROR),
    ("a short PING", frame(6, 0, 0, b"1234"), "PING of 4 bytes", FRAME_SIZE_ERROR),
    ("SETTINGS on a stream", frame(4, 0, 1, b""), "on stream 1", PROTOCOL_ERROR),
    ("a ragged SETTINGS", frame(4, 0, 0, b"\0\1\0\0\0"), "SETTINGS frame of 5 bytes", FRAME_SIZE_ERROR),
    (
        "a huge frame size",
        frame(4, 0, 0, b"\0\5" + (1 << 24).to_bytes(4, "big")),
        "MAX_FRAME_SIZE",
        PROTOCOL_ERROR,
    ),
    ("a window over 2^31-1", frame(4, 0, 0, b"\0\4\x80\0\0\0"), "INITIAL_WINDOW_SIZE", FLOW_CONTROL_ERROR),
    ("a short RST_STREAM", frame(3, 0, 1, b"\0"), "RST_STREAM of 1 bytes", FRAME_SIZE_ERROR),
    ("a short GOAWAY", frame(7, 0, 0, b"\0\0"), "GOAWAY of 2 bytes", FRAME_SIZE_ERROR),
    ("a stray CONTINUATION", frame(9, 0x4, 1, b""), "continues no header block", PROTOCOL_ERROR),
    (
        "a frame inside a header block",
        frame(1, 0, 1, b"") + frame(6, 0, 0, b"12345678"),
        "came between",
        PROTOCOL_ERROR,
    ),
    (
        "an undecodable header block",
        frame(1, 0x4, 1, b"\xff\xff\xff\xff\xff"),
        "does not decode",
        COMPRESSION_ERROR,
    ),
    ("a response without a status", None, "without a valid :status", PROTOCOL_ERROR),
]


@pytest.mark.parametrize(("what", "data", "named", "code"), HOSTILE, ids=[case[0] for case in HOSTILE])
def test_a_protocol_violation_is_refused_by_name(
    what: str, data: bytes | None, named: str, code: int
) -> None:
    pair = Pair()
    stream_id = pair.open()
    assert stream_id == 1
    if data is None:
        data = frame(1, 0x4, 1, pair.server.encoder.encode([(b"content-type", b"text/plain")]))
    with pytest.raises(WireError, match=named) as refused:
        pair.to_client(data)
    assert refused.value.code == code


def test_more_than_a_window_is_refused() -> None:
    pair = Pair()
    stream_id = pair.open()
    chunk = frame(0, 0, stream_id, b"x" * (1 << 14))
    with pytest.raises(WireError, match="stream 1's window") as refused:
        pair.to_client(chunk * (WINDOW // (1 << 14) + 1))
    assert refused.value.code == FLOW_CONTROL_ERROR


def test_a_header_block_past_the_bound_is_refused() -> None:
    pair = Pair()
    pair.open()
    data = frame(1, 0, 1, b"\0" * (1 << 14))
    data += frame(9, 0, 1, b"\0" * (1 << 14)) * (MAX_HEADER_BLOCK // (1 << 14))
    with pytest.raises(WireError, match="header block over"):
        pair.to_client(data)


def test_the_first_frame_must_be_settings() -> None:
    wire = Wire(Heard(), stream_window=WINDOW, connection_window=WINDOW)
    wire.initiate()
    with pytest.raises(WireError, match="first frame was not SETTINGS"):
        wire.receive(frame(6, 0, 0, b"12345678"))


def test_requests_never_use_the_dynamic_table_and_credentials_are_never_indexed() -> None:
    """A server cannot make us keep what we sent, and no table (ours, a proxy's) may keep a token."""
    pair = Pair()
    pair.to_client(frame(4, 0, 0, (1).to_bytes(2, "big") + (1 << 30).to_bytes(4, "big")))
    token = (b"authorization", b"Bearer " + b"t" * 900)
    for number in range(3):
        stream_id = pair.wire.open_stream([*REQUEST, (b"user-agent", b"mcruntime"), token])
        [request] = [e for e in pair.to_server() if isinstance(e, h2.events.RequestReceived)]
        assert request.stream_id == stream_id == 1 + 2 * number
        assert [tuple(header) for header in request.headers][-1] == token
        sent = [header for header in request.headers if header[0] == b"authorization"]
        assert isinstance(sent[0], hpack.NeverIndexedHeaderTuple)  # every hop must keep it unindexed
    assert len(pair.server.decoder.header_table.dynamic_entries) == 0
