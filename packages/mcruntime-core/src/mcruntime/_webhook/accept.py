"""Accepting a webhook connection: the TLS handshake's ALPN picks HTTP/2 or HTTP/1.1."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import cast

from .._base.wrapping import Wrapping
from .h2conn import Http2Connection

Open = dict[asyncio.Transport, "asyncio.Future[None]"]
"""The connections a server holds, each with a future that is done when its socket is gone."""


class Accepted(Wrapping):
    """Serves one connection with the protocol its TLS handshake chose, and records it until it is gone.

    ALPN decides: ``h2`` gets an :class:`Http2Connection`, anything else
    aiohttp's HTTP/1.1 handler. aiohttp closes a TLS connection politely
    (close_notify, then wait for the peer's). A peer that never answers would
    keep the socket open for the SSL shutdown timeout, past ``close()`` and
    past the event loop; the record lets ``close()`` abort what is still open
    after the grace period.
    """

    def __init__(
        self,
        http1: Callable[[], asyncio.Protocol],
        http2: Callable[[], Http2Connection] | None,
        open_: Open,
        h2_open: set[Http2Connection],
    ) -> None:
        self._http1 = http1
        self._http2 = http2
        self._open = open_
        self._h2_open = h2_open
        self._inner: asyncio.Protocol | None = None
        self._transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream transport, from create_server: uvloop's is one without subclassing it.
        stream = self._transport = cast("asyncio.Transport", transport)
        self._open[stream] = asyncio.get_running_loop().create_future()
        tls = transport.get_extra_info("ssl_object")
        if self._http2 is not None and tls is not None and tls.selected_alpn_protocol() == "h2":
            inner: asyncio.Protocol = self._http2()
            self._h2_open.add(cast("Http2Connection", inner))
        else:
            inner = self._http1()
        self._inner = inner
        inner.connection_made(transport)

    def connection_lost(self, exc: Exception | None) -> None:
        gone = self._open.pop(self._transport, None) if self._transport is not None else None
        if gone is not None and not gone.done():
            gone.set_result(None)
        if self._inner is not None:
            if isinstance(self._inner, Http2Connection):
                self._h2_open.discard(self._inner)
            self._inner.connection_lost(exc)
