"""Our TLS transport (the socket's own TLS, driven by the loop's selector) keeps asyncio's promises.

Every request and watch of the client rides on it, so the suite's tests against
real API servers exercise its common path. These pin the paths an API server
rarely takes: a write larger than the socket takes at once (the "want write"
retry of the same bytes), a close whose bytes the server never reads, the
server's close reaching the protocol once, a protocol that raises, many records
and a long body, and a server the client does not trust. The server is
asyncio's own TLS server on loopback.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import socket
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from mcruntime._client.tls_socket import TLSTransport, open_tls
from mcruntime.testing._pki import CertificateAuthority

BOUND = 30.0  # seconds: a bound on waits for the other end, never a measurement

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


class Recorder(asyncio.Protocol):
    """Keeps what the transport told it, in order."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.data = bytearray()
        self.lost: asyncio.Future[Exception | None] = asyncio.get_running_loop().create_future()
        self.wanted = 0
        self.enough = asyncio.Event()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.calls.append("made")

    def data_received(self, data: bytes) -> None:
        self.data += data
        if len(self.data) >= self.wanted:
            self.enough.set()

    def eof_received(self) -> bool | None:
        self.calls.append("eof")
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self.calls.append("lost")
        self.lost.set_result(exc)


@pytest.fixture
def ca() -> CertificateAuthority:
    return CertificateAuthority("tls-socket")


@pytest.fixture
def server_context(tmp_path: Path, ca: CertificateAuthority) -> ssl.SSLContext:
    pair = ca.issue("loopback", server_hosts=("127.0.0.1",))
    (tmp_path / "tls.crt").write_bytes(pair.cert_pem)
    (tmp_path / "tls.key").write_bytes(pair.key_pem)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(tmp_path / "tls.crt", tmp_path / "tls.key")
    return context


@pytest.fixture
def client_context(ca: CertificateAuthority) -> ssl.SSLContext:
    return ssl.create_default_context(cadata=ca.cert_pem.decode())


@asynccontextmanager
async def serving(context: ssl.SSLContext, handler: Handler) -> AsyncIterator[int]:
    server = await asyncio.start_server(handler, "127.0.0.1", 0, ssl=context)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()
        await server.wait_closed()


async def connect(port: int, context: ssl.SSLContext) -> tuple[TLSTransport, Recorder]:
    return await open_tls(Recorder, "127.0.0.1", port, context=context, server_hostname="127.0.0.1")


async def test_a_write_larger_than_the_socket_takes_arrives_whole_in_order_before_the_close(
    server_context: ssl.SSLContext, client_context: ssl.SSLContext
) -> None:
    chunks = [bytes([n]) * (4 << 20) for n in range(1, 9)]  # 32 MiB: more than loopback's buffers hold
    expected = hashlib.sha256(b"".join(chunks)).hexdigest()
    start_reading = asyncio.Event()
    received: asyncio.Future[tuple[int, str]] = asyncio.get_running_loop().create_future()

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await start_reading.wait()
        digest, total = hashlib.sha256(), 0
        while chunk := await reader.read(1 << 20):  # to the client's close
            digest.update(chunk)
            total += len(chunk)
        received.set_result((total, digest.hexdigest()))
        writer.close()

    async with serving(server_context, handler) as port:
        transport, protocol = await connect(port, client_context)
        for chunk in chunks:
            transport.write(chunk)
        held = transport.get_write_buffer_size()
        transport.close()  # sends what is held first
        assert transport.is_closing()
        start_reading.set()
        async with asyncio.timeout(BOUND):
            total, digest = await received
            assert await protocol.lost is None
    assert held > 0, "the socket took 32 MiB at once: the retry of held bytes was not exercised"
    assert total == sum(len(chunk) for chunk in chunks)
    assert digest == expected
    assert protocol.calls == ["made", "lost"]


async def test_a_close_whose_bytes_a_server_never_reads_ends_the_connection_after_its_bound(
    server_context: ssl.SSLContext, client_context: ssl.SSLContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(TLSTransport, "close_timeout", 0.2)  # the bound under test, shortened; not a timing
    release, server_done = asyncio.Event(), asyncio.Event()

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await release.wait()  # never reads while the client closes
        writer.close()
        with contextlib.suppress(ConnectionError, ssl.SSLError):  # the client is long gone
            await writer.wait_closed()
        server_done.set()

    async with serving(server_context, handler) as port:
        transport, protocol = await connect(port, client_context)
        transport.write(b"x" * (32 << 20))
        assert transport.get_write_buffer_size() > 0
        transport.close()
        async with asyncio.timeout(BOUND):
            assert await protocol.lost is None
        assert transport.get_write_buffer_size() == 0  # dropped with the socket, not held
        release.set()
        async with asyncio.timeout(BOUND):
            await server_done.wait()


async def test_the_servers_close_reaches_the_protocol_once_after_its_data(
    server_context: ssl.SSLContext, client_context: ssl.SSLContext
) -> None:
    server_closed = asyncio.Event()

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"goodbye")
        await writer.drain()
        writer.close()
        await writer.wait_closed()  # until the client answers the TLS close
        server_closed.set()

    async with serving(server_context, handler) as port:
        transport, protocol = await connect(port, client_context)
        async with asyncio.timeout(BOUND):
            assert await protocol.lost is None
            await server_closed.wait()
    assert bytes(protocol.data) == b"goodbye"
    assert protocol.calls == ["made", "eof", "lost"]
    assert transport.is_closing()
    transport.write(b"after the end")  # ignored, as asyncio's transport does: nothing raises


async def test_many_short_records_and_a_long_body_are_all_delivered_in_order(
    server_context: ssl.SSLContext, client_context: ssl.SSLContext
) -> None:
    records = [f"event {n:05d}\n".encode() for n in range(2000)]  # each write is a TLS record of its own
    records.append(bytes(range(256)) * (16 << 10))  # 4 MiB in full records, as a LIST's body comes

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        for record in records:
            writer.write(record)
        await writer.drain()
        await reader.read()  # until the client closes

    async with serving(server_context, handler) as port:
        transport, protocol = await connect(port, client_context)
        protocol.wanted = sum(len(record) for record in records)
        async with asyncio.timeout(BOUND):
            await protocol.enough.wait()
        transport.close()
        async with asyncio.timeout(BOUND):
            await protocol.lost
    assert bytes(protocol.data) == b"".join(records)


async def test_a_protocol_that_raises_ends_its_connection_with_that_error(
    server_context: ssl.SSLContext, client_context: ssl.SSLContext, caplog: pytest.LogCaptureFixture
) -> None:
    server_saw_end = asyncio.Event()

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"something the reader cannot take")
        await writer.drain()
        await reader.read()  # until the client's side is gone
        server_saw_end.set()

    class Raising(Recorder):
        def data_received(self, data: bytes) -> None:
            raise ValueError("the reader's own bug")

    async with serving(server_context, handler) as port:
        with caplog.at_level(logging.ERROR, logger="mcruntime.transport"):
            transport, protocol = await open_tls(
                Raising, "127.0.0.1", port, context=client_context, server_hostname="127.0.0.1"
            )
            async with asyncio.timeout(BOUND):
                error = await protocol.lost
                await server_saw_end.wait()
    assert isinstance(error, ValueError) and str(error) == "the reader's own bug"
    assert transport.is_closing()
    assert "the connection's reader failed" in caplog.text


async def test_a_server_the_client_does_not_trust_is_refused_and_no_protocol_is_made(
    server_context: ssl.SSLContext,
) -> None:
    made: list[Recorder] = []

    def factory() -> Recorder:
        made.append(Recorder())
        return made[-1]

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read()

    stranger = ssl.create_default_context(cadata=CertificateAuthority("stranger").cert_pem.decode())
    async with serving(server_context, handler) as port:
        with pytest.raises(ssl.SSLCertVerificationError):
            await open_tls(factory, "127.0.0.1", port, context=stranger, server_hostname="127.0.0.1")
    assert made == []


async def test_a_port_nobody_listens_on_raises_the_connections_error(client_context: ssl.SSLContext) -> None:
    with socket.socket() as bound:  # bound, never listening: the port is ours and refuses
        bound.bind(("127.0.0.1", 0))
        with pytest.raises(ConnectionRefusedError):
            await connect(bound.getsockname()[1], client_context)


async def test_a_name_whose_every_address_refuses_raises_that_refusal(
    client_context: ssl.SSLContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two addresses refusing alike (``localhost`` as ::1 and 127.0.0.1) is one named failure, not "OSError"."""
    with socket.socket() as first, socket.socket() as second:  # bound, never listening: each refuses
        first.bind(("127.0.0.1", 0))
        second.bind(("127.0.0.2", first.getsockname()[1]))
        port = first.getsockname()[1]
        loop = asyncio.get_running_loop()

        async def two_addresses(host: str, port: int, **_: object) -> list[tuple[object, ...]]:
            return [
                (socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", ("127.0.0.1", port)),
                (socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", ("127.0.0.2", port)),
            ]

        monkeypatch.setattr(loop, "getaddrinfo", two_addresses)
        with pytest.raises(ConnectionRefusedError):
            await open_tls(
                Recorder, "both.example", port, context=client_context, server_hostname="127.0.0.1"
            )
