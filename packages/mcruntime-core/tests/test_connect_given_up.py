"""A connection given up just as its TLS handshake finished is dropped at once, not left closing.

asyncio closes such a connection politely: it sends its TLS close and keeps the
socket until the server answers, 30 s by default. A caller cancelled at that
moment (a timeout, a cluster stopping) then leaves a socket behind, and a test
process that ends first sees it as an unclosed transport (first seen on 3.12
under load). Both our pools, HTTP/1.1 requests and HTTP/2 watches, must abort
what they made instead. The server here finishes the handshake and never reads
again, so only an abort ends the connection before the bound. (Our TLS transport
calls ``connection_made`` in the connecting task itself, so the cancel lands at
the caller's next wait: the request's answer, the HTTP/2 connection's SETTINGS.)
"""

from __future__ import annotations

import asyncio
import socket
import ssl
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from mcruntime._client import http1, multiplex
from mcruntime._client.http1 import RequestPool
from mcruntime._client.multiplex import Multiplexer
from mcruntime.testing._pki import CertificateAuthority

BOUND = 10.0  # seconds; a polite close would hold the socket for asyncio's 30 s shutdown timeout


class SilentServer:
    """Accepts one TLS connection, completes its handshake, then neither reads nor closes it."""

    def __init__(self, tmp_path: Path, ca: CertificateAuthority) -> None:
        pair = ca.issue("silent", server_hosts=("127.0.0.1",))
        (tmp_path / "tls.crt").write_bytes(pair.cert_pem)
        (tmp_path / "tls.key").write_bytes(pair.key_pem)
        self.context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.context.load_cert_chain(tmp_path / "tls.crt", tmp_path / "tls.key")
        self.context.set_alpn_protocols(["h2", "http/1.1"])
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        connection, _ = self.listener.accept()
        with self.context.wrap_socket(connection, server_side=True):
            self.done.wait()

    def stop(self) -> None:
        self.done.set()
        self.listener.close()
        self.thread.join()


@pytest.fixture
def ca() -> CertificateAuthority:
    return CertificateAuthority("given-up")


@pytest.fixture
def server(tmp_path: Path, ca: CertificateAuthority) -> Iterator[SilentServer]:
    silent = SilentServer(tmp_path, ca)
    try:
        yield silent
    finally:
        silent.stop()


def _cancel_when_made(monkeypatch: pytest.MonkeyPatch, protocol: type[asyncio.Protocol]) -> asyncio.Event:
    """Cancel the connecting task the moment the handshake finishes; the event marks the loss."""
    made, lost = protocol.connection_made, protocol.connection_lost
    gone = asyncio.Event()
    task = asyncio.current_task()
    assert task is not None

    def connection_made(self: asyncio.Protocol, transport: asyncio.BaseTransport) -> None:
        made(self, transport)
        task.cancel()

    def connection_lost(self: asyncio.Protocol, exc: Exception | None) -> None:
        lost(self, exc)
        gone.set()

    monkeypatch.setattr(protocol, "connection_made", connection_made)
    monkeypatch.setattr(protocol, "connection_lost", connection_lost)
    return gone


async def test_a_request_given_up_as_its_handshake_finished_drops_the_connection(
    server: SilentServer, ca: CertificateAuthority, monkeypatch: pytest.MonkeyPatch
) -> None:
    gone = _cancel_when_made(monkeypatch, http1._Connection)
    pool = RequestPool(
        f"https://127.0.0.1:{server.port}", ssl.create_default_context(cadata=ca.cert_pem.decode())
    )
    try:
        with pytest.raises(asyncio.CancelledError):
            await pool.request("GET", "/version", None, {}, None, connect_timeout=BOUND)
        asyncio.current_task().uncancel()  # type: ignore[union-attr]
        async with asyncio.timeout(BOUND):
            await gone.wait()
        assert pool.connections == 0
    finally:
        pool.close()


async def test_a_watch_given_up_as_its_handshake_finished_drops_the_connection(
    server: SilentServer, ca: CertificateAuthority, monkeypatch: pytest.MonkeyPatch
) -> None:
    gone = _cancel_when_made(monkeypatch, multiplex._Channel)
    context = ssl.create_default_context(cadata=ca.cert_pem.decode())
    context.set_alpn_protocols(["h2"])  # as a cluster's watch context does: the server picks h2

    async def tls() -> ssl.SSLContext:
        return context

    multiplexer = Multiplexer(f"https://127.0.0.1:{server.port}", server_hostname=None, connect_timeout=BOUND)
    try:
        with pytest.raises(asyncio.CancelledError):
            await multiplexer.open("/api/v1/configmaps", {"watch": "1"}, {}, None, tls)
        asyncio.current_task().uncancel()  # type: ignore[union-attr]
        async with asyncio.timeout(BOUND):
            await gone.wait()
        assert len(multiplexer) == 0
    finally:
        multiplexer.close()
