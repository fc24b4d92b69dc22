"""A hostile API server on the watches' HTTP/2 connection: bounded, and named for what it did.

Each server here is a fake speaking raw frames over TLS (ALPN ``h2``) on
127.0.0.1, so it can break the protocol as no real one would: flood PINGs or
SETTINGS and never read the acknowledgements, repeat GOAWAY endlessly, reset
every stream, send oversized frames or endless CONTINUATION. The watch's
error must say what the server did (its text reaches the informer and the
cluster's health), and nothing the server repeats may grow without bound,
memory or log lines alike.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
import struct
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest

from mcruntime._base import h2frames
from mcruntime._client.multiplex import Multiplexer, StreamClosed
from mcruntime.testing import wait_until
from mcruntime.testing._pki import CertificateAuthority

DATA, HEADERS, RST_STREAM, SETTINGS, PING, GOAWAY, CONTINUATION = 0, 1, 3, 4, 6, 7, 9
END_STREAM = ACK = 0x1
END_HEADERS = 0x4
PROTOCOL_ERROR, INTERNAL_ERROR, FRAME_SIZE_ERROR, ENHANCE_YOUR_CALM = 0x1, 0x2, 0x6, 0xB
STATUS_200 = b"\x88"  # HPACK static table entry 8, ":status: 200"
LAST_STREAM_ID = (1 << 31) - 1
DEADLINE = 20.0

Play = Callable[["Peer"], Awaitable[None]]


def frame(kind: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    return struct.pack(">I", len(payload))[1:] + struct.pack(">BBI", kind, flags, stream_id) + payload


def goaway(last: int, code: int) -> bytes:
    return frame(GOAWAY, 0, 0, struct.pack(">II", last, code))


class Peer:
    """The fake server's side of one connection: the watch's stream id and the raw socket."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.stream_id = 0
        self.goaways: list[int] = []
        """GOAWAY error codes the client sent, once :meth:`read_to_end` ran."""

    async def read_frame(self) -> tuple[int, int, int, bytes]:
        head = await self.reader.readexactly(9)
        length = int.from_bytes(head[:3], "big")
        kind, flags, stream_id = struct.unpack(">BBI", head[3:])
        return kind, flags, stream_id & LAST_STREAM_ID, await self.reader.readexactly(length)

    async def handshake(self) -> None:
        """The preface and SETTINGS both ways, up to the watch's request (its HEADERS)."""
        await self.reader.readexactly(24)
        self.writer.write(frame(SETTINGS, 0, 0))
        kind = None
        while kind != HEADERS:
            kind, flags, stream_id, _ = await self.read_frame()
            if kind == SETTINGS and not flags & ACK:
                self.writer.write(frame(SETTINGS, ACK, 0))
        self.stream_id = stream_id
        await self.writer.drain()

    def answer(self) -> None:
        self.writer.write(frame(HEADERS, END_HEADERS, self.stream_id, STATUS_200))

    async def read_to_end(self) -> None:
        """Read what the client sends until it closes, noting its GOAWAYs."""
        with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError, ssl.SSLError):
            while True:
                kind, _, _, payload = await self.read_frame()
                if kind == GOAWAY:
                    self.goaways.append(int.from_bytes(payload[4:8], "big"))


@pytest.fixture
def ca() -> CertificateAuthority:
    return CertificateAuthority("hostile-h2")


@pytest.fixture
def server_context(tmp_path: Path, ca: CertificateAuthority) -> ssl.SSLContext:
    pair = ca.issue("hostile", server_hosts=("127.0.0.1",))
    (tmp_path / "tls.crt").write_bytes(pair.cert_pem)
    (tmp_path / "tls.key").write_bytes(pair.key_pem)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(tmp_path / "tls.crt", tmp_path / "tls.key")
    context.set_alpn_protocols(["h2"])
    return context


class Hostile:
    """A fake server's connections, and the multiplexer our watches to it open on."""

    def __init__(self, multiplexer: Multiplexer, context: ssl.SSLContext) -> None:
        self.multiplexer = multiplexer
        self.name = multiplexer.name
        self.peers: list[Peer] = []
        self._context = context

    async def tls(self) -> ssl.SSLContext:
        return self._context

    async def watch_fails(self) -> StreamClosed:
        """Open a watch and read it until it fails; the error it failed with."""
        with pytest.raises(StreamClosed) as failed:
            await asyncio.wait_for(self._watch(), DEADLINE)
        return failed.value

    async def _watch(self) -> None:
        stream = await self.multiplexer.open("/api/v1/configmaps", {"watch": "1"}, {}, None, self.tls)
        assert stream is not None
        async for _ in stream.iter_any():
            pass

    async def client_said_goaway(self) -> list[int]:
        await wait_until(lambda: self.peers and self.peers[0].goaways, timeout=DEADLINE, what="our GOAWAY")
        return self.peers[0].goaways


@contextlib.asynccontextmanager
async def hostile(
    server_context: ssl.SSLContext, ca: CertificateAuthority, play: Play
) -> AsyncIterator[Hostile]:
    """A fake server playing ``play`` on each connection, and a multiplexer of watches to it.

    The server's receive buffer is small, so a server that stops reading
    leaves our bytes in our own write buffer soon, as a loaded one would.
    """
    tasks: list[asyncio.Task[None]] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = Peer(reader, writer)
        fake.peers.append(peer)
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError, ssl.SSLError):
            await peer.handshake()
            await play(peer)

    def accepted(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        tasks.append(asyncio.ensure_future(serve(reader, writer)))

    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    listener.bind(("127.0.0.1", 0))
    server = await asyncio.start_server(accepted, sock=listener, ssl=server_context)
    client_context = ssl.create_default_context(cadata=ca.cert_pem.decode())
    client_context.set_alpn_protocols(["h2"])  # as a cluster's watch context does
    port = listener.getsockname()[1]
    multiplexer = Multiplexer(f"https://127.0.0.1:{port}", server_hostname=None, connect_timeout=5.0)
    fake = Hostile(multiplexer, client_context)
    try:
        yield fake
    finally:
        multiplexer.close()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for peer in fake.peers:
            peer.writer.transport.abort()
        server.close()
        await server.wait_closed()


@pytest.mark.parametrize("flood", ["PING", "SETTINGS"])
async def test_a_server_flooding_frames_to_acknowledge_and_never_reading_is_refused_with_enhance_your_calm(
    server_context: ssl.SSLContext,
    ca: CertificateAuthority,
    monkeypatch: pytest.MonkeyPatch,
    flood: str,
) -> None:
    monkeypatch.setattr(h2frames, "MAX_ACK_BACKLOG", 1 << 16)  # smaller bounds, the same rule: quicker
    monkeypatch.setattr(h2frames, "MAX_ACKS_BACKLOGGED", 100)
    burst = (frame(PING, 0, 0, b"12345678") if flood == "PING" else frame(SETTINGS, 0, 0)) * 4096
    refused = asyncio.Event()

    async def play(peer: Peer) -> None:
        peer.answer()

        async def pour() -> None:
            while True:  # never reading: the client's acknowledgements stay in its write buffer
                peer.writer.write(burst)
                await peer.writer.drain()

        pouring = asyncio.ensure_future(pour())
        await refused.wait()
        pouring.cancel()  # blocked on a client that stopped reading; now read what it said
        await peer.read_to_end()

    async with hostile(server_context, ca, play) as fake:
        error = await fake.watch_fails()
        refused.set()
        text = str(error)
        assert f"the server {fake.name} flooded the HTTP/2 connection: a {flood} flood" in text
        assert text.endswith("(GOAWAY ENHANCE_YOUR_CALM)")
        assert await fake.client_said_goaway() == [ENHANCE_YOUR_CALM]


async def test_a_goaway_flood_is_acted_on_and_logged_once_and_may_only_lower_the_last_stream(
    server_context: ssl.SSLContext, ca: CertificateAuthority, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="mcruntime.transport")

    async def play(peer: Peer) -> None:
        peer.answer()
        repeated = goaway(LAST_STREAM_ID, 0) * 1000
        for _ in range(5):
            peer.writer.write(repeated)
            await peer.writer.drain()
        peer.writer.write(goaway(LAST_STREAM_ID, 0) + goaway(0, 0))  # lowered: the watch is not kept
        await peer.read_to_end()

    async with hostile(server_context, ca, play) as fake:
        error = await fake.watch_fails()
        lines = [record.getMessage() for record in caplog.records if "GOAWAY" in record.getMessage()]
        assert len(lines) == 1, lines[:3]
        assert fake.name in lines[0]
        assert fake.multiplexer.goaways == 1
        assert str(error) == f"the server {fake.name} sent GOAWAY (NO_ERROR)"


async def _reset(peer: Peer) -> None:
    peer.answer()
    peer.writer.write(frame(RST_STREAM, 0, peer.stream_id, struct.pack(">I", PROTOCOL_ERROR)))
    await peer.read_to_end()


async def _oversized(peer: Peer) -> None:
    peer.answer()
    peer.writer.write(frame(DATA, 0, peer.stream_id, b"x" * 100_000))
    await peer.read_to_end()


async def _endless_continuation(peer: Peer) -> None:
    peer.writer.write(frame(HEADERS, 0, peer.stream_id, STATUS_200))
    for _ in range(1000):
        peer.writer.write(frame(CONTINUATION, 0, peer.stream_id))
    await peer.read_to_end()


async def _goaway_then_close(peer: Peer) -> None:
    peer.answer()
    peer.writer.write(goaway(LAST_STREAM_ID, INTERNAL_ERROR))
    await peer.writer.drain()
    peer.writer.close()


@pytest.mark.parametrize(
    ("play", "said", "goaway_code"),
    [
        (_reset, "the server {} reset the watch stream (PROTOCOL_ERROR)", None),
        (
            _oversized,
            "HTTP/2 protocol error from the server {}: a frame of 100000 bytes, over the 16384 allowed "
            "(GOAWAY FRAME_SIZE_ERROR)",
            FRAME_SIZE_ERROR,
        ),
        (
            _endless_continuation,
            "the server {} flooded the HTTP/2 connection: a header block in more than 64 CONTINUATION "
            "frames (GOAWAY ENHANCE_YOUR_CALM)",
            ENHANCE_YOUR_CALM,
        ),
        (
            _goaway_then_close,
            "the server {} sent GOAWAY (INTERNAL_ERROR), then the server closed the connection",
            None,
        ),
    ],
    ids=["reset", "oversized-data", "endless-continuation", "goaway-then-close"],
)
async def test_what_the_server_did_is_named_in_the_watchs_error(
    server_context: ssl.SSLContext,
    ca: CertificateAuthority,
    play: Play,
    said: str,
    goaway_code: int | None,
) -> None:
    async with hostile(server_context, ca, play) as fake:
        error = await fake.watch_fails()
        assert str(error) == said.format(fake.name)
        if goaway_code is not None:  # and the server was told why
            assert await fake.client_said_goaway() == [goaway_code]
