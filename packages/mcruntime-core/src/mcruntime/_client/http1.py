"""Requests to one API server over keep-alive HTTP/1.1 connections of our own.

A controller's writes are small requests, one after another, and aiohttp's
client is general: URL objects, cookie jars, tracing hooks, a stream reader
and several loop turns per response. Measured against a real API server,
four PATCHes at a time, it cost about 700 µs of our CPU per request where a
protocol that writes the request in one piece and hands the bytes it reads
to a C parser (httptools, llhttp) costs about 300. The difference is most of
what a write-heavy controller spends of its own, and CPU it does not spend is
CPU the API servers of a one-node fleet get.

This does only what requests to an API server need: one request at a time
per connection, idle connections kept for reuse (LIFO, dropped after
``keepalive`` seconds or when the server closes them), bodies by length or
chunked, gzip answers decoded. Watches do not come here (``multiplex.py`` and
aiohttp carry them), nor do servers behind a proxy (aiohttp's CONNECT).
Everything the server sends is bounded: its headers, and its body before and
after decompression. No error text quotes a URL, a header or a credential.
"""

from __future__ import annotations

import asyncio
import ssl
import zlib
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from typing import cast
from urllib.parse import quote, urlencode, urlsplit

import httptools

from .tls_socket import open_tls
from .wording import os_reason, plain_word

MAX_HEADER_BYTES = 256 * 1024
"""The most header bytes (names and values) an answer may carry."""
HEAD_FRAMING_BYTES = 16 * 1024
"""Bytes of an answer's head allowed beyond :data:`MAX_HEADER_BYTES`: its status line, colons and line ends.

The head is counted as it arrives, not only header by header: the parser
hands over a header only once its value ends, and grows an unfinished value
by copying it, so a value that never ends would cost time quadratic in its
length and never reach the per-header count.
"""
MAX_BODY_BYTES = 128 * 1024 * 1024
"""The most body bytes an answer may carry, decoded or not.

A list page is 500 objects, most of a few KiB (etcd refuses any over 1.5
MiB): a page is rarely over a few tens of MiB, and this holds 500 of 256 KiB
each. It is also what a server whose body never ends costs in memory, once
(an answer refused for its size is not asked for again): kept well under the
200 MB a hostile server may cost us.
"""

_PATH_SAFE = "/%:@!$&'()*+,;=-._~"  # RFC 3986 pchar and "/"; "%" keeps escapes already made


class RequestFailed(Exception):
    """No answer to one request, in words safe to log.

    ``never_sent``: the request surely did not reach the server (no
    connection was made), so even a write may be retried. ``tls``: the TLS
    handshake failed (trust or identity), which says nothing about whether
    the server is up. ``timed_out``: the connection was not made in time.
    """

    def __init__(self, message: str, *, never_sent: bool, tls: bool = False, timed_out: bool = False) -> None:
        super().__init__(message)
        self.message = message
        self.never_sent = never_sent
        self.tls = tls
        self.timed_out = timed_out


class AnswerTooLarge(RequestFailed):
    """The server answered, with more than a bound allows: asking again would get the same answer."""

    def __init__(self, message: str) -> None:
        super().__init__(message, never_sent=False)


class Headers(Mapping[str, str]):
    """An answer's headers, looked up without regard to case; repeated ones joined with ", ".

    Decoded on first use: most answers are read for their status and body only.
    """

    __slots__ = ("_items", "_raw")

    def __init__(self, raw: list[tuple[bytes, bytes]]) -> None:
        self._raw = raw
        self._items: dict[str, str] | None = None

    def _decoded(self) -> dict[str, str]:
        items = self._items
        if items is None:
            items = self._items = {}
            for name, value in self._raw:
                key = name.decode("latin-1").lower()
                text = value.decode("latin-1")
                items[key] = f"{items[key]}, {text}" if key in items else text
        return items

    def values_of(self, name: bytes) -> list[str]:
        """Each value of header ``name`` (lower-case) on its own, without decoding the rest.

        For headers that may repeat and whose values cannot be split once joined
        (``Warning``: a quoted text may hold the comma).
        """
        size = len(name)
        raw = self._raw
        return [value.decode("latin-1") for key, value in raw if len(key) == size and key.lower() == name]

    def __getitem__(self, name: str) -> str:
        return self._decoded()[name.lower()]

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name.lower() in self._decoded()

    def __iter__(self) -> Iterator[str]:
        return iter(self._decoded())

    def __len__(self) -> int:
        return len(self._decoded())

    def __repr__(self) -> str:
        return f"<Headers {sorted(self._decoded())}>"  # names only: a value may be a cookie


Answer = tuple[int, Headers, bytes]


class _Connection(asyncio.Protocol):
    """One TLS (or plain) connection; one request on it at a time."""

    def __init__(self, pool: RequestPool) -> None:
        self._pool = pool
        self._parser = httptools.HttpResponseParser(self)
        self._transport: asyncio.Transport | None = None
        self._waiter: asyncio.Future[Answer] | None = None
        self._headers: list[tuple[bytes, bytes]] = []
        self._header_bytes = 0
        self._head_room: int | None = None  # bytes the head may still take; None once it ended
        self._quiet = 0  # bytes after the head since the last body bytes or trailer
        self._moved = False  # the last read brought body bytes or a trailer
        self._body: list[bytes] = []
        self._body_bytes = 0
        self._status = 0
        self._encoding = "identity"
        self.reusable = False
        self.closed = False
        self.idle_since = 0.0

    # --- asyncio.Protocol ---------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport = cast("asyncio.Transport", transport)  # uvloop's is one, without subclassing it
        self._transport = transport

    def data_received(self, data: bytes) -> None:
        if self._waiter is None:  # bytes nobody asked for: the connection cannot be trusted
            self.abort()
            return
        room = self._head_room
        if room is not None:  # counted before the parser sees them: it would not tell us in time
            if len(data) <= room:
                self._head_room = room - len(data)
                self._feed(data)
                return
            head, data = data[:room], data[room:]
            self._head_room = 0
            if head and not self._feed(head):
                return
            if not self._head_ended():
                self._fail(_too_many_headers(), too_large=True)
                return
            if not data:
                return
        # After the head, bytes that bring neither body nor a whole trailer (chunk extensions, a
        # trailer whose value never ends) are bounded as a head is: the parser copies an
        # unfinished value on every read. A read that moved the answer on may hide up to its
        # own length of such bytes, so the stretch is bounded within one read of the limit.
        quiet = self._quiet + len(data)
        self._moved = False
        if not self._feed(data):
            return
        self._quiet = 0 if self._moved else quiet
        if self._quiet > MAX_HEADER_BYTES + HEAD_FRAMING_BYTES and self._waiter is not None:
            self._fail(
                f"the server's answer has over {(MAX_HEADER_BYTES + HEAD_FRAMING_BYTES) // 1024} KiB "
                "after its head that are neither body nor a whole trailer",
                too_large=True,
            )

    def _head_ended(self) -> bool:
        """Whether the parser has seen the whole head (a method: the parse moves it, behind mypy's back)."""
        return self._head_room is None

    def _feed(self, data: bytes) -> bool:
        """Parse ``data``; ``False`` when the answer failed (and the connection was dropped)."""
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserCallbackError as error:  # a bound of ours, raised in a callback
            cause = error.__context__
            if isinstance(cause, _Refused):
                self._fail(str(cause), too_large=isinstance(cause, _TooLarge))
            else:
                self._fail("the server's answer could not be read")
        except (httptools.HttpParserError, httptools.HttpParserUpgrade) as error:
            self._fail(f"the server's answer is not valid HTTP/1.1 ({type(error).__name__})")
        return not self.closed

    def eof_received(self) -> bool | None:
        return None  # close our side too

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.reusable = False
        self._pool.forget(self)
        if self._waiter is not None and not self._waiter.done():
            if isinstance(exc, ssl.SSLError):
                detail = f"TLS error: {plain_word(getattr(exc, 'reason', None)) or type(exc).__name__}"
            elif isinstance(exc, OSError):
                detail = f"connection lost: {os_reason(exc)}"
            else:
                detail = "the server closed the connection before answering"
            self._waiter.set_exception(RequestFailed(detail, never_sent=False))

    # --- httptools callbacks ----------------------------------------------------------

    def on_message_begin(self) -> None:
        if self._waiter is None:  # a second answer to one request: what follows cannot be trusted
            raise _Refused("the server sent an answer to no request")

    def on_header(self, name: bytes, value: bytes) -> None:
        self._moved = True  # a trailer, after the head
        self._header_bytes += len(name) + len(value)
        if self._header_bytes > MAX_HEADER_BYTES:
            raise _TooLarge(_too_many_headers())
        self._headers.append((name, value))
        if len(name) == 16 and name.lower() == b"content-encoding":
            self._encoding = value.decode("latin-1").strip().lower()

    def on_headers_complete(self) -> None:
        self._head_room = None
        self._status = self._parser.get_status_code()

    def on_body(self, body: bytes) -> None:
        self._moved = True
        self._body_bytes += len(body)
        if self._body_bytes > MAX_BODY_BYTES:
            raise _TooLarge(f"the server's answer is over {MAX_BODY_BYTES >> 20} MiB")
        self._body.append(body)

    def on_message_complete(self) -> None:
        waiter, self._waiter = self._waiter, None
        headers = Headers(self._headers)
        body = self._body[0] if len(self._body) == 1 else b"".join(self._body)
        encoding = self._encoding
        self._headers, self._body, self._header_bytes, self._body_bytes = [], [], 0, 0
        self._encoding = "identity"
        self.reusable = self._parser.should_keep_alive()
        if waiter is None or waiter.done():
            return
        if encoding == "gzip":
            try:
                body = _gunzip(body)
            except _TooLarge as error:
                self.reusable = False
                waiter.set_exception(AnswerTooLarge(str(error)))
                return
            except zlib.error:
                self.reusable = False
                waiter.set_exception(RequestFailed("the server's gzip body is corrupt", never_sent=False))
                return
        elif encoding != "identity":
            self.reusable = False
            message = f"the server answered in an encoding not asked for ({encoding[:40]!r})"
            waiter.set_exception(RequestFailed(message, never_sent=False))
            return
        waiter.set_result((self._status, headers, body))

    # --- our side -----------------------------------------------------------------

    async def exchange(self, request: bytes) -> Answer:
        """Send ``request`` and wait for its whole answer."""
        transport = self._transport
        if transport is None or self.closed:
            raise RequestFailed("the server closed the connection before answering", never_sent=False)
        self.reusable = False
        waiter: asyncio.Future[Answer] = asyncio.get_running_loop().create_future()
        self._waiter = waiter
        self._head_room = MAX_HEADER_BYTES + HEAD_FRAMING_BYTES
        self._quiet = 0
        transport.write(request)
        return await waiter

    def _fail(self, message: str, *, too_large: bool = False) -> None:
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_exception(
                AnswerTooLarge(message) if too_large else RequestFailed(message, never_sent=False)
            )
        self.abort()

    def abort(self) -> None:
        self.closed = True
        self.reusable = False
        self._body, self._headers = [], []  # what a refused answer read: not kept past its refusal
        self._pool.forget(self)
        if self._transport is not None:
            self._transport.abort()


class _Refused(Exception):
    """An answer not to be read further; raised out of a parser callback, which stops the parse."""


class _TooLarge(_Refused):
    """An answer over a bound of size: the server's own answer, which asking again would repeat."""


def _too_many_headers() -> str:
    return f"the server's answer has over {MAX_HEADER_BYTES // 1024} KiB of headers"


def _gunzip(body: bytes) -> bytes:
    decoder = zlib.decompressobj(16 + zlib.MAX_WBITS)
    plain = decoder.decompress(body, MAX_BODY_BYTES + 1)
    if len(plain) > MAX_BODY_BYTES or decoder.unconsumed_tail:
        raise _TooLarge(f"the server's answer is over {MAX_BODY_BYTES >> 20} MiB once decompressed")
    if not decoder.eof:
        raise zlib.error("truncated")
    return plain


class RequestPool:
    """Keep-alive HTTP/1.1 connections to one server, for requests; close it once.

    ``context`` is the TLS context of an ``https`` server (``None`` for plain
    HTTP), ``server_hostname`` the name its certificate is checked against
    when it is not the URL's host.
    """

    def __init__(
        self,
        server: str,
        context: ssl.SSLContext | None,
        *,
        server_hostname: str | None = None,
        keepalive: float = 75.0,
        user_agent: str = "mcruntime",
    ) -> None:
        url = urlsplit(server)
        if url.scheme not in ("https", "http") or not url.hostname:
            raise ValueError("the server URL must be https://host[:port][/path] or http://...")
        secure = url.scheme == "https"
        try:
            self._host = url.hostname.encode("idna").decode("ascii")  # an internationalized name, too
        except UnicodeError:
            raise ValueError("the server's host name is not a valid DNS name") from None
        self._port = url.port or (443 if secure else 80)
        self._context = context if secure else None
        self._server_hostname = (server_hostname or self._host) if secure else None
        self._prefix = url.path.rstrip("/")
        literal = f"[{self._host}]" if ":" in self._host else self._host
        default_port = self._port == (443 if secure else 80)
        host = literal if default_port else f"{literal}:{self._port}"
        self._fixed = f"Host: {host}\r\nUser-Agent: {user_agent}\r\nAccept-Encoding: gzip\r\n"
        self._keepalive = keepalive
        self._idle: deque[_Connection] = deque()
        self._all: set[_Connection] = set()
        self._sweeper: asyncio.TimerHandle | None = None
        self.closed = False

    def __repr__(self) -> str:
        return f"<RequestPool {self._host}:{self._port} idle={len(self._idle)} open={len(self._all)}>"

    @property
    def connections(self) -> int:
        """Connections open now, busy or idle."""
        return len(self._all)

    async def request(
        self,
        method: str,
        path: str,
        params: Mapping[str, str] | None,
        headers: Mapping[str, str],
        body: bytes | None,
        connect_timeout: float,
    ) -> Answer:
        """Send one request and return its status, headers and (decoded) body.

        Raises :class:`RequestFailed` when no answer came, ``ValueError`` for
        a header this will not send (a line break in a token, say). The
        caller bounds the whole request's time; cancelling it drops the
        connection, whose state is then unknown.
        """
        target = quote(self._prefix + path, safe=_PATH_SAFE)
        if params:
            target = f"{target}?{urlencode(params)}"
        lines = [f"{method} {target} HTTP/1.1\r\n", self._fixed]
        for name, value in headers.items():
            if "\r" in value or "\n" in value or "\0" in value or not name.isascii() or ":" in name:
                raise ValueError(f"a control character or malformed name in the {name!r} header")
            if not value.isascii():  # refused here, not by the encoder, whose error would quote it
                raise ValueError(f"a character outside ASCII in the {name!r} header")
            lines.append(f"{name}: {value}\r\n")
        lines.append(f"Content-Length: {len(body)}\r\n\r\n" if body is not None else "\r\n")
        request = "".join(lines).encode("ascii") + (body or b"")  # the path is quoted: all ASCII
        connection = self._take()
        if connection is None:
            connection = await self._connect(connect_timeout)
        try:
            answer = await connection.exchange(request)
        except BaseException:
            connection.abort()
            raise
        if connection.reusable and not self.closed:
            self._put(connection)
        else:
            connection.abort()
        return answer

    async def _connect(self, timeout: float) -> _Connection:
        made: list[_Connection] = []

        def protocol() -> _Connection:
            made.append(_Connection(self))
            return made[-1]

        try:
            return await self._open(protocol, timeout)
        except BaseException:
            # Given up (a timeout, a cancelled caller) just as a TLS handshake finished: asyncio
            # closes that connection politely, and its socket would wait on a server that may
            # never answer the close. Aborted, it is gone at once.
            for connection in made:
                connection.abort()
            raise

    async def _open(self, protocol: Callable[[], _Connection], timeout: float) -> _Connection:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(timeout):
                if self._context is None:
                    _, connection = await loop.create_connection(protocol, self._host, self._port)
                else:
                    _, connection = await open_tls(
                        protocol,
                        self._host,
                        self._port,
                        context=self._context,
                        server_hostname=self._server_hostname,
                    )
        except TimeoutError:
            raise RequestFailed(
                f"cannot connect: no connection in {timeout:g}s", never_sent=True, timed_out=True
            ) from None
        except ssl.SSLCertVerificationError as error:
            reason = plain_word(error.verify_message) or plain_word(error.reason) or type(error).__name__
            raise RequestFailed(f"TLS verification failed: {reason}", never_sent=True, tls=True) from None
        except ssl.SSLError as error:
            reason = plain_word(getattr(error, "reason", None)) or type(error).__name__
            raise RequestFailed(f"TLS error: {reason}", never_sent=True, tls=True) from None
        except OSError as error:
            raise RequestFailed(f"cannot connect: {os_reason(error)}", never_sent=True) from None
        if self.closed:  # closed while connecting
            connection.abort()
            raise RequestFailed("the connection pool was closed", never_sent=True)
        self._all.add(connection)
        return connection

    def _take(self) -> _Connection | None:
        idle = self._idle
        while idle:
            connection = idle.pop()
            if not connection.closed:
                return connection
        return None

    def _put(self, connection: _Connection) -> None:
        loop = asyncio.get_running_loop()
        connection.idle_since = loop.time()
        self._idle.append(connection)
        if self._sweeper is None:
            self._sweeper = loop.call_later(self._keepalive, self._sweep)

    def _sweep(self) -> None:
        """Close connections idle for ``keepalive`` seconds (oldest first); come back for the rest."""
        self._sweeper = None
        idle = self._idle
        now = asyncio.get_running_loop().time()
        while idle and (idle[0].closed or now - idle[0].idle_since >= self._keepalive):
            idle.popleft().abort()
        if idle and not self.closed:
            delay = max(0.0, idle[0].idle_since + self._keepalive - now)
            self._sweeper = asyncio.get_running_loop().call_later(delay, self._sweep)

    def forget(self, connection: _Connection) -> None:
        """A connection closed (by either side): it is no longer counted (idle ones are skipped)."""
        self._all.discard(connection)

    def close(self) -> None:
        """Drop every connection, idle or busy (their requests fail as not answered)."""
        self.closed = True
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        self._idle.clear()
        for connection in list(self._all):
            connection.abort()
        self._all.clear()
