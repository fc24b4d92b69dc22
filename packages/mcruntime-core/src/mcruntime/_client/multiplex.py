"""Watches multiplexed over HTTP/2: a few connections carry every watch of a server.

Under HTTP/1.1 each open watch holds a TLS connection of its own, so a
process watching 10,000 clusters holds 10,000 sockets, and their API servers
pay a handshake and a credential check for each. Where the server offers
HTTP/2 (ALPN ``h2``, as kube-apiserver does), the watches of every cluster
sharing a session (same server and trust, see ``connection.py``) open as
streams of one connection, and of another only when the server's limit of
concurrent streams is reached.

Isolation holds through flow control. Each stream has a window of its own,
opened again only as its reader consumes what arrived, and the connection's
window is large enough that readers who stop cannot hold it shut: one
cluster's slow watch stalls its own stream only. A reader who hears nothing
for its read timeout (found by the connection's one timer, ``silence.py``)
asks the connection for a PING. An answered PING says
the server is alive and only that watch is quiet; an unanswered one closes
the connection, and every stream on it fails as a dropped HTTP/1.1 watch
does, for its informer to reopen.

A server that breaks the protocol or floods the connection (PINGs or SETTINGS
it never reads the answers of, endless CONTINUATION frames) gets a GOAWAY
naming the fault, and every stream on the connection fails at once with
words saying what the server did, for the watch's error and health to carry.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from collections.abc import Awaitable, Callable, Mapping
from typing import cast
from urllib.parse import urlencode, urlsplit

from .._base.http2 import ENHANCE_YOUR_CALM
from .silence import Sweep
from .stream import Stream as Stream  # importable from here as before
from .stream import WatchResponse as WatchResponse
from .tls_socket import open_tls
from .wire import CANCEL, Wire, WireError, error_name
from .wording import StreamClosed as StreamClosed  # raised here; importable from here as before

log = logging.getLogger("mcruntime.transport")

STREAM_WINDOW = 1 << 20
"""Bytes one watch may leave unread before its server waits for it (not the others)."""
_CONNECTION_WINDOW = (1 << 31) - 1
_IDLE_SECONDS = 60.0
"""A connection with no stream for this long is closed; a new watch opens another."""
_PING = b"mcruntme"
_UNSENDABLE = frozenset(b"\r\n\x00")


def request_headers(
    pseudo: list[tuple[bytes, bytes]], headers: Mapping[str, str]
) -> list[tuple[bytes, bytes]]:
    """A stream's header block, built valid here instead of normalised by h2 on every send.

    h2's outbound normalisation and validation walked every header of every
    stream (7 % of a 10,000-cluster engage). The block is ours, so it is
    built right once: names lower-cased, values stripped of surrounding
    whitespace (as h2's normalisation and HTTP/1.1 servers do), credentials
    never indexed, and a value that could not be sent (a line break or NUL,
    from a hostile kubeconfig say) refused by naming the header, never
    quoting the value.
    """
    block = [*pseudo, (b"user-agent", b"mcruntime")]
    for name, value in headers.items():
        key = name.lower().encode("ascii")
        data = value.encode("latin-1").strip()
        if _UNSENDABLE.intersection(data):
            raise ValueError(f"header {name!r} has a line break or a NUL; not sent")
        block.append((key, data))  # credentials are coded never indexed (headerblock.SECRET_HEADERS)
    return block


class ChannelUnavailable(Exception):
    """No HTTP/2 connection could be opened; the message says why, for the cluster's health."""

    def __init__(self, message: str, error: BaseException | None = None) -> None:
        super().__init__(message)
        self.error = error


class _Channel(asyncio.Protocol):
    """One HTTP/2 connection and the streams open on it; hears its :class:`Wire` as its listener."""

    def __init__(self, owner: Multiplexer) -> None:
        self._owner = owner
        self._wire = Wire(
            self, stream_window=STREAM_WINDOW, connection_window=_CONNECTION_WINDOW, backlog=self._unsent
        )
        self._transport: asyncio.Transport | None = None
        self.streams: dict[int, Stream] = {}
        self.lost: str | None = None
        self.draining = False
        self.negotiated: str | None = None
        self.ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._ping: asyncio.TimerHandle | None = None
        self._idle: asyncio.TimerHandle | None = None
        self._grace: asyncio.TimerHandle | None = None
        self._goaway: tuple[int, str] | None = None
        """The server's GOAWAY, once one came: the lowest last stream id it gave, and its words."""
        self.sweep = Sweep(lambda: [stream._silent for stream in self.streams.values()])
        """The read-timeout timer of every stream on this connection."""

    @property
    def has_room(self) -> bool:
        if self.lost is not None or self.draining or not self.ready.done() or self._wire.exhausted:
            return False
        return len(self.streams) < self._wire.max_concurrent_streams

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport = cast("asyncio.Transport", transport)  # uvloop's is one, without subclassing it
        self._transport = transport
        tls = transport.get_extra_info("ssl_object")
        self.negotiated = tls.selected_alpn_protocol() if tls is not None else None
        if self.negotiated != "h2":
            return  # the multiplexer closes it and remembers that the server speaks HTTP/1.1 only
        self._wire.initiate()
        self._flush()

    def open_stream(self, headers: list[tuple[bytes, bytes]], read_timeout: float | None) -> Stream:
        stream_id = self._wire.open_stream(headers)
        stream = self.streams[stream_id] = Stream(self, stream_id, read_timeout)
        if self._idle is not None:
            self._idle.cancel()
            self._idle = None
        self._flush()
        return stream

    def data_received(self, data: bytes) -> None:
        if self.lost is not None:
            return  # refused, closed or dropped: what the server still sends changes nothing
        try:
            self._wire.receive(data)
        except WireError as error:
            self._refuse(error)
            return
        self._flush()

    def _unsent(self) -> int:
        """Bytes written and not yet taken by the server: where a flood's acknowledgements pile up."""
        transport = self._transport
        return transport.get_write_buffer_size() if transport is not None else 0

    def _refuse(self, error: WireError) -> None:
        """The server broke HTTP/2: GOAWAY naming the fault, and every stream fails now with its words.

        The streams fail here, not when the socket is gone: a server that
        never reads would keep our GOAWAY (behind the acknowledgements it left
        unread) and the connection open, and their watches waiting. The socket
        is left open, what arrives read and dropped, until the server closes
        it or the connect timeout passes: closed at once with the server's
        bytes unread, the kernel would reset it and the server lose the GOAWAY
        that says why.
        """
        code = error_name(error.code)
        if error.code == ENHANCE_YOUR_CALM:
            reason = f"the server {self._owner.name} flooded the HTTP/2 connection: {error} (GOAWAY {code})"
        else:
            reason = f"HTTP/2 protocol error from the server {self._owner.name}: {error} (GOAWAY {code})"
        if self.lost is None:
            self.lost = reason
        log.warning("%s; %d watch stream(s) on the connection reopen", reason, len(self.streams))
        self._wire.goaway(error.code)
        self._flush()
        streams, self.streams = self.streams, {}
        for stream in streams.values():
            stream._fail(StreamClosed(reason))
        transport = self._transport
        if transport is not None and not transport.is_closing():
            self._grace = asyncio.get_running_loop().call_later(self._owner.connect_timeout, transport.abort)

    # --- what the server sent, from the wire ------------------------------------------

    def on_settings(self) -> None:
        if not self.ready.done():
            self.ready.set_result(None)

    def on_response(self, stream_id: int, status: int, headers: list[tuple[bytes, bytes]]) -> None:
        stream = self.streams.get(stream_id)
        if stream is not None:
            stream._answered(*_status_and_headers(headers))

    def on_data(self, stream_id: int, data: bytes, flowed: int) -> None:
        stream = self.streams.get(stream_id)
        if stream is None:  # in flight when we reset it
            self.consumed(stream_id, flowed)
        else:
            stream._feed(data, flowed)

    def on_end(self, stream_id: int) -> None:
        stream = self._forget(stream_id)
        if stream is not None:
            stream._end()

    def on_reset(self, stream_id: int, code: int) -> None:
        stream = self._forget(stream_id)
        if stream is not None:
            reason = f"the server {self._owner.name} reset the watch stream ({error_name(code)})"
            stream._fail(StreamClosed(reason))

    def on_ping_ack(self) -> None:
        if self._ping is not None:
            self._ping.cancel()
            self._ping = None

    def on_goaway(self, last_stream_id: int, code: int) -> None:
        self._terminated(last_stream_id, code)

    def _terminated(self, last: int, error_code: int) -> None:
        """GOAWAY: streams the server kept run on; no new ones open here.

        Acted on and logged once per connection. A later GOAWAY may only
        lower the last stream id (RFC 9113 6.8: a server warns with the
        highest, then names the last it took): that fails the streams above
        it, without a log line, so a server repeating GOAWAY costs no more than
        its frames. One raising it is ignored, as it may not.
        """
        if self._goaway is not None:
            lowest, reason = self._goaway
            if last >= lowest:
                return
            self._goaway = (last, reason)
            self._refuse_above(last, reason)
            return
        self.draining = True
        code = error_name(error_code)
        reason = f"the server {self._owner.name} sent GOAWAY ({code})"
        self._goaway = (last, reason)
        refused = sum(1 for stream_id in self.streams if stream_id > last)
        self._owner.goaways += 1
        log.info(
            "%s sent GOAWAY (%s): %d watch stream(s) on the connection run until the server ends them, "
            "%d reopen on a new connection",
            self._owner.name,
            code,
            len(self.streams) - refused,
            refused,
        )
        self._refuse_above(last, reason)

    def _refuse_above(self, last: int, reason: str) -> None:
        for stream_id in [stream_id for stream_id in self.streams if stream_id > last]:
            stream = self._forget(stream_id)
            if stream is not None:
                stream._fail(StreamClosed(reason))
        if not self.streams:
            self.close()

    def _forget(self, stream_id: int) -> Stream | None:
        stream = self.streams.pop(stream_id, None)
        if stream is not None and not self.streams and self.lost is None:
            if self.draining:
                self.close()
            elif self._idle is None:
                self._idle = asyncio.get_running_loop().call_later(_IDLE_SECONDS, self._close_if_idle)
        return stream

    def _close_if_idle(self) -> None:
        self._idle = None
        if not self.streams:
            self.close()

    def consumed(self, stream_id: int, flowed: int, *, flush: bool = True) -> None:
        """``flowed`` bytes of ``stream_id`` were read (or dropped): open its windows again."""
        if self.lost is not None or not flowed:
            return
        self._wire.consumed(stream_id, flowed)
        if flush:
            self._flush()

    def reset(self, stream_id: int) -> None:
        if self._forget(stream_id) is None or self.lost is not None:
            return
        self._wire.reset(stream_id, CANCEL)
        self._flush()

    def check_alive(self) -> None:
        """A reader heard nothing for its timeout: PING, and close the connection if unanswered."""
        if self._ping is not None or self.lost is not None or self._transport is None:
            return
        self._wire.ping(_PING)
        self._flush()
        timeout = self._owner.connect_timeout
        self._ping = asyncio.get_running_loop().call_later(
            timeout, self.abort, f"no answer to an HTTP/2 PING in {timeout:g}s"
        )

    def _flush(self) -> None:
        data = self._wire.data_to_send()
        if data and self._transport is not None and not self._transport.is_closing():
            self._transport.write(data)

    def abort(self, reason: str) -> None:
        """Drop the connection now; every stream on it fails with ``reason``."""
        if self.lost is None:
            self.lost = reason
        if self._transport is not None:
            self._transport.abort()

    def close(self) -> None:
        """Close politely (GOAWAY): nothing is open on it, or the process is done with it."""
        if self.lost is not None or self._transport is None:
            return
        self.lost = "the connection was closed"
        self._wire.goaway()
        self._flush()
        self._transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.lost is None:
            self.lost = f"connection lost: {exc}" if exc is not None else "the server closed the connection"
            if self._goaway is not None:  # the streams it kept: say why the server ended them
                self.lost = f"{self._goaway[1]}, then {self.lost}"
        for timer in (self._ping, self._idle, self._grace):
            if timer is not None:
                timer.cancel()
        self._ping = self._idle = self._grace = None
        self.sweep.stop()
        streams, self.streams = self.streams, {}
        for stream in streams.values():
            stream._fail(StreamClosed(self.lost))
        if not self.ready.done():
            self.ready.set_exception(ChannelUnavailable(self.lost, exc))
            self.ready.exception()  # retrieved here: a connect that failed is reported by its opener
        self._owner._lost(self)


def _status_and_headers(raw: list[tuple[bytes, bytes]] | list[tuple[str, str]]) -> tuple[int, dict[str, str]]:
    status = 0
    headers: dict[str, str] = {}
    for name, value in raw:
        key = name.decode("latin-1") if isinstance(name, bytes) else name
        text = value.decode("latin-1") if isinstance(value, bytes) else value
        if key == ":status":
            status = int(text)
        else:
            headers[key] = text
    return status, headers


class Multiplexer:
    """The HTTP/2 connections of one session: watches open as streams, on as few as the server allows."""

    def __init__(self, server: str, *, server_hostname: str | None, connect_timeout: float) -> None:
        url = urlsplit(server)
        self._host = url.hostname or ""
        self._port = url.port or 443
        self._authority = url.netloc.rsplit("@", 1)[-1].encode()
        self._prefix = url.path.rstrip("/")
        self._server_hostname = server_hostname
        self._context: ssl.SSLContext | None = None
        self.connect_timeout = connect_timeout
        self._channels: list[_Channel] = []
        self._connecting = asyncio.Lock()
        self.unsupported: str | None = None
        self.closed = False
        self.goaways = 0
        """GOAWAY frames received: the server shutting down, or rebalancing its clients."""

    @property
    def name(self) -> str:
        """The server, for log lines: ``host:port``."""
        return f"{self._host}:{self._port}"

    def __len__(self) -> int:
        return len(self._channels)

    async def open(
        self,
        path: str,
        params: Mapping[str, str] | None,
        headers: Mapping[str, str],
        read_timeout: float | None,
        context: Callable[[], Awaitable[ssl.SSLContext]],
    ) -> Stream | None:
        """Open a watch's stream and wait for its response's headers; ``None`` without HTTP/2 here.

        ``context`` builds the TLS context when a first connection is made;
        it is the caller's, so a cluster that stopped meanwhile cannot leave
        the clusters sharing this multiplexer without one. Raises
        :class:`ChannelUnavailable` when no connection could be made.
        """
        query = f"?{urlencode(params)}" if params else ""
        request = request_headers(
            [
                (b":method", b"GET"),
                (b":scheme", b"https"),
                (b":authority", self._authority),
                (b":path", f"{self._prefix}{path}{query}".encode()),
            ],
            headers,
        )
        channel = self._with_room()
        if channel is None:
            async with self._connecting:
                channel = self._with_room()
                if channel is None:
                    if self.unsupported is not None or self.closed:
                        return None
                    channel = await self._connect(context)
                    if channel is None:
                        return None
        stream = channel.open_stream(request, read_timeout)
        try:
            await stream.response()
        except BaseException:
            stream.close()
            raise
        return stream

    def _with_room(self) -> _Channel | None:
        for channel in self._channels:
            if channel.has_room:
                return channel
        return None

    async def _connect(self, context: Callable[[], Awaitable[ssl.SSLContext]]) -> _Channel | None:
        made: list[_Channel] = []

        def protocol() -> _Channel:
            made.append(_Channel(self))
            return made[-1]

        try:
            return await self._open(context, protocol)
        except BaseException:
            # Given up (a timeout, a cancelled caller) just as the TLS handshake finished: asyncio
            # would close the connection politely and leave its socket waiting on the server.
            for channel in made:
                self._lost(channel)
                if not channel.ready.done():
                    channel.ready.cancel()  # nobody waits for it now
                channel.abort("the connection attempt was given up")
            raise

    async def _open(
        self, context: Callable[[], Awaitable[ssl.SSLContext]], protocol: Callable[[], _Channel]
    ) -> _Channel | None:
        try:
            if self._context is None:
                self._context = await context()
            async with asyncio.timeout(self.connect_timeout):
                transport, channel = await open_tls(
                    protocol,
                    self._host,
                    self._port,
                    context=self._context,
                    server_hostname=self._server_hostname or self._host,
                )
                if channel.negotiated != "h2":
                    offered = channel.negotiated or "no protocol"
                    self.unsupported = f"the server offered {offered} over ALPN, not h2"
                    transport.abort()  # not closed politely: nothing was sent, and no socket lingers
                    return None
                self._channels.append(channel)
                await asyncio.shield(channel.ready)
        except ChannelUnavailable:
            raise
        except TimeoutError as error:
            message = f"no HTTP/2 connection within {self.connect_timeout:g}s"
            raise ChannelUnavailable(message, error) from None
        except (OSError, ssl.SSLError) as error:
            raise ChannelUnavailable(str(error) or type(error).__name__, error) from None
        return channel

    def _lost(self, channel: _Channel) -> None:
        with contextlib.suppress(ValueError):
            self._channels.remove(channel)

    def check_alive(self) -> None:
        """PING every connection: a cluster of this server stopped answering (its circuit opened)."""
        for channel in self._channels:
            channel.check_alive()

    def close(self) -> None:
        """Drop every connection now: its session closed (the last cluster using it stopped).

        Aborted rather than closed politely, so no socket outlives the stop
        waiting on a TLS shutdown the server may never answer.
        """
        self.closed = True
        for channel in list(self._channels):
            channel.abort("the cluster was stopped")
        self._channels.clear()
