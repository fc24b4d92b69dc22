"""TLS connections read and written through the socket's own TLS, not asyncio's ``sslproto``.

asyncio's TLS transport runs every record through a memory BIO and a state
machine written in Python: each chunk the server sends costs a dozen Python
calls and two reads of the TLS object, the second only to learn (from an
exception) that nothing more is there. For a watch that trickles one event per
read, that was the largest share of an event's CPU left (benchmark S8). Here
the connected socket is wrapped by ``ssl`` itself: OpenSSL reads the socket,
a read returns the decrypted bytes, and the loop's selector says when to read
again.

The transport offers what our two protocols use of asyncio's (``write``,
``close``, ``abort``, ``is_closing``, ``get_extra_info("ssl_object")``, the
protocol callbacks) with asyncio's order of calls: ``connection_made`` first,
``connection_lost`` once, from the loop, after the socket is closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
from collections import deque
from collections.abc import Callable
from typing import Any, TypeVar

log = logging.getLogger("mcruntime.transport")

# One read returns one record (16 KiB of plaintext at most). The buffer is allocated per read
# and shrunk to what came: at 256 KiB it is above glibc's mmap threshold, and every read
# cost an mmap, an mremap and an munmap; at 64 KiB it comes from the heap.
_READ_SIZE = 64 * 1024
_READS_PER_WAKE = 16  # records decrypted in one wake-up before the other sockets get their turn
_FULL_RECORD = 16384  # TLS's largest record of plaintext

P = TypeVar("P", bound=asyncio.Protocol)


async def open_tls(
    protocol_factory: Callable[[], P],
    host: str,
    port: int,
    *,
    context: ssl.SSLContext,
    server_hostname: str | None,
) -> tuple[TLSTransport, P]:
    """Connect to ``host:port``, shake hands, and start ``protocol_factory()``'s protocol on the connection.

    Raises what ``loop.create_connection`` raises for the same failures:
    :class:`OSError` for the connection, :class:`ssl.SSLError` (and its
    certificate subclass) for the handshake. Cancelled or timed out by the
    caller, the socket is closed before the cancellation goes on.
    """
    loop = asyncio.get_running_loop()
    sock = await _connect(loop, host, port)
    try:
        tls = context.wrap_socket(sock, server_hostname=server_hostname, do_handshake_on_connect=False)
    except BaseException:
        sock.close()
        raise
    transport: TLSTransport | None = None
    try:
        await _handshake(loop, tls)
        protocol = protocol_factory()
        transport = TLSTransport(loop, tls, protocol)
        transport.start()
    except BaseException:
        if transport is None:
            tls.close()
        else:
            transport.abort()
        raise
    return transport, protocol


async def _connect(loop: asyncio.AbstractEventLoop, host: str, port: int) -> socket.socket:
    """A connected, non-blocking TCP socket to the first of ``host``'s addresses that answers."""
    addresses = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP)
    if not addresses:
        raise OSError(f"no address for {host!r}")
    errors: list[OSError] = []
    for family, kind, proto, _name, address in addresses:
        sock = socket.socket(family, kind, proto)
        try:
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            await loop.sock_connect(sock, address)
        except OSError as error:
            sock.close()
            errors.append(error)
            continue
        except BaseException:
            sock.close()
            raise
        return sock
    if len({error.errno for error in errors}) == 1:
        raise errors[0]  # the same failure at every address (each message names its own): say it once
    raise OSError("; ".join(str(error) for error in errors))


async def _handshake(loop: asyncio.AbstractEventLoop, tls: ssl.SSLSocket) -> None:
    fd = tls.fileno()
    while True:
        try:
            tls.do_handshake()
        except ssl.SSLWantReadError:
            await _ready(fd, loop.add_reader, loop.remove_reader, loop)
        except ssl.SSLWantWriteError:
            await _ready(fd, loop.add_writer, loop.remove_writer, loop)
        else:
            return


async def _ready(
    fd: int,
    add: Callable[..., None],
    remove: Callable[[int], bool],
    loop: asyncio.AbstractEventLoop,
) -> None:
    woken: asyncio.Future[None] = loop.create_future()
    add(fd, _settle, woken)
    try:
        await woken
    finally:
        remove(fd)


def _settle(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class TLSTransport(asyncio.Transport):
    """A TLS socket driven by the loop's selector; see the module's docstring."""

    close_timeout: float = 30.0
    """Seconds a close waits for its unsent bytes (asyncio's TLS shutdown timeout)."""

    def __init__(
        self, loop: asyncio.AbstractEventLoop, tls: ssl.SSLSocket, protocol: asyncio.Protocol
    ) -> None:
        super().__init__()
        self._loop = loop
        self._tls = tls
        self._fd = tls.fileno()
        self._protocol = protocol
        self._extra: dict[str, Any] = {
            "ssl_object": tls,
            "socket": tls,
            "peername": _address(tls.getpeername),
            "sockname": _address(tls.getsockname),
            "peercert": tls.getpeercert(),
            "cipher": tls.cipher(),
            "compression": tls.compression(),
        }
        # Writes TLS has not taken yet; the first is retried whole (OpenSSL wants the same bytes again).
        self._pending: deque[bytes] = deque()
        self._writing = False  # the selector watches for room to write
        self._reading = False
        self._read_wants_write = False  # a read needs the socket writable first (a key update)
        self._write_wants_read = False  # a write needs a read first (never in TLS 1.3; kept for 1.2)
        self._closing = False
        self._closed = False
        self._deadline: asyncio.TimerHandle | None = None  # a close waiting for its writes to go out

    def start(self) -> None:
        """Hand the protocol its transport and start reading; asyncio's order."""
        self._protocol.connection_made(self)
        if not self._closing:
            self._loop.add_reader(self._fd, self._read_ready)
            self._reading = True

    # --- asyncio.Transport --------------------------------------------------------

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self._extra.get(name, default)

    def is_closing(self) -> bool:
        return self._closing

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        assert isinstance(protocol, asyncio.Protocol)
        self._protocol = protocol

    def get_protocol(self) -> asyncio.BaseProtocol:
        return self._protocol

    def is_reading(self) -> bool:
        return self._reading

    def pause_reading(self) -> None:
        if self._reading and not self._closing:
            self._loop.remove_reader(self._fd)
            self._reading = False

    def resume_reading(self) -> None:
        if not self._reading and not self._closing:
            self._loop.add_reader(self._fd, self._read_ready)
            self._reading = True

    def get_write_buffer_size(self) -> int:
        return sum(len(data) for data in self._pending)

    def can_write_eof(self) -> bool:
        return False  # TLS has no half-close

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if not data or self._closing:
            return
        if self._pending:
            self._pending.append(bytes(data))
            return
        try:
            self._tls.send(data)  # all of it, or a "want" error (no partial writes in ssl's mode)
        except ssl.SSLWantWriteError:
            self._pending.append(bytes(data))
            self._watch_writable()
        except ssl.SSLWantReadError:
            self._pending.append(bytes(data))
            self._write_wants_read = True
        except (ssl.SSLError, OSError) as error:
            self._fail(error)

    def close(self) -> None:
        """Send what is written, then a TLS close and the socket's close; ``connection_lost(None)`` after.

        A server that stops reading would hold the unsent bytes, and the
        socket, forever: after :attr:`close_timeout` the connection is aborted.
        """
        if self._closing:
            return
        self._closing = True
        self._stop_reading()
        if not self._pending:
            self._shut()
        else:
            self._deadline = self._loop.call_later(self.close_timeout, self._close_now, None)

    def abort(self) -> None:
        """Close the socket now, dropping what is not sent; no TLS close is sent."""
        self._close_now(None)

    # --- the selector's callbacks -----------------------------------------------

    def _read_ready(self) -> None:
        if self._write_wants_read:
            self._write_wants_read = False
            self._write_ready()
        tls = self._tls
        for _ in range(_READS_PER_WAKE):
            if self._closed:
                return
            try:
                data = tls.recv(_READ_SIZE)
            except ssl.SSLWantReadError:
                return
            except ssl.SSLWantWriteError:
                self._read_wants_write = True
                self._watch_writable()
                return
            except (ssl.SSLError, OSError) as error:
                self._fail(error)
                return
            if not data:
                self._end_of_stream()
                return
            try:
                self._protocol.data_received(data)
            except Exception as error:  # as asyncio does: the protocol's bug ends its connection, loudly
                log.exception("the connection's reader failed; the connection is closed")
                self._fail(error)
                return
            if not self._reading or (len(data) < _FULL_RECORD and not tls.pending()):
                # A short record ends what the server sent (an event, an answer): the selector
                # says when there is more, with no read that fails to find out. A full one is
                # likely a LIST's body going on: read on, up to the bound.
                return

    def _write_ready(self) -> None:
        if self._read_wants_write:
            self._read_wants_write = False
            self._read_ready()
        pending = self._pending
        while pending and not self._closed:
            try:
                self._tls.send(pending[0])
            except ssl.SSLWantWriteError:
                self._watch_writable()
                return
            except ssl.SSLWantReadError:
                self._write_wants_read = True
                self._stop_writing()
                return
            except (ssl.SSLError, OSError) as error:
                self._fail(error)
                return
            pending.popleft()
        self._stop_writing()
        if self._closing and not self._closed:
            self._shut()

    # --- ending -----------------------------------------------------------------

    def _end_of_stream(self) -> None:
        """The server closed (with or without a TLS close): the protocol hears it, then it ends."""
        self._stop_reading()
        try:
            self._protocol.eof_received()  # TLS cannot stay half open, whatever the protocol answers
        except Exception as error:
            log.exception("the connection's reader failed at its end; the connection is closed")
            self._close_now(error)
            return
        self._shut()  # our TLS close answers the server's, so its side ends at once too

    def _shut(self) -> None:
        with contextlib.suppress(ssl.SSLError, OSError, ValueError):
            self._tls.unwrap()  # sends our TLS close; the server's answer is not waited for
        self._close_now(None)

    def _fail(self, error: BaseException) -> None:
        log.debug("TLS connection to %s failed: %s", self._extra.get("peername"), error)
        self._close_now(error if isinstance(error, Exception) else None)

    def _close_now(self, error: Exception | None) -> None:
        if self._closed:
            return
        self._closing = self._closed = True
        if self._deadline is not None:
            self._deadline.cancel()
        self._stop_reading()
        self._stop_writing()
        self._pending.clear()
        self._tls.close()
        self._loop.call_soon(self._lost, error)

    def _lost(self, error: Exception | None) -> None:
        self._protocol.connection_lost(error)

    def _watch_writable(self) -> None:
        if not self._writing and not self._closed:
            self._loop.add_writer(self._fd, self._write_ready)
            self._writing = True

    def _stop_writing(self) -> None:
        if self._writing:
            self._loop.remove_writer(self._fd)
            self._writing = False

    def _stop_reading(self) -> None:
        if self._reading:
            self._loop.remove_reader(self._fd)
            self._reading = False


def _address(read: Callable[[], Any]) -> Any:
    try:
        return read()
    except OSError:
        return None
