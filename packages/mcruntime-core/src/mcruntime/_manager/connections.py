"""How many connections an endpoint server holds, and how long one may go without a request.

aiohttp's server bounds neither: it keeps a connection that sends nothing for
an hour (its 75 s default is ``run_app``'s only) and accepts until the process
runs out of file descriptors. 10,000 idle clients took /healthz down that way
(the liveness probe then kills the pod), and at the fd limit asyncio logged
every failed accept. Kubelet probes and Prometheus send their request as soon
as they connect and reconnect cheaply, so both bounds can be tight.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, cast

from .._base.wrapping import Wrapping

if TYPE_CHECKING:
    from aiohttp import web
    from aiohttp.typedefs import Handler

log = logging.getLogger("mcruntime.serving")

IDLE_TIMEOUT = 5.0
"""Seconds a connection may go without a request.

From opening to its first request's headers this module's timer closes it
(older aiohttp arms its own only after a first answer); from one answer to
the next request's headers, aiohttp's keep-alive timer does, and partial
headers do not restart it. So it is also the bound on receiving a request's
headers: aiohttp has no separate one.
"""
MAX_CONNECTIONS = 256
"""Connections one endpoint server holds at once: a few probes and scrapers need a handful,
and 256 keeps the fds, and the task aiohttp runs for each, far below a pod's limit."""
REPORT_INTERVAL = 60.0
"""Seconds between two log lines about connections closed at the cap: an attack makes thousands."""


class Connections:
    """The connections of one endpoint server: counted, timed until their first request, shed at the cap.

    At the cap a new connection displaces the one idle longest (no request in
    a handler, half-sent headers included): were the newcomer always the one
    refused, a client holding the cap's worth of connections, reopening each
    as it times out, would keep the kubelet's probe out. Only when every
    connection is in a request is the newcomer closed.
    """

    def __init__(self, address: str, *, limit: int, idle_timeout: float) -> None:
        self.address = address
        self.limit = limit
        self.idle_timeout = idle_timeout
        self._open: dict[asyncio.BaseTransport, _Connection] = {}
        # Without a request in a handler, longest idle first: a dict keeps insertion order.
        self._idle: dict[_Connection, None] = {}
        self._shed = self._refused = 0
        self._reported: float | None = None

    def accept(self, handlers: Callable[[], asyncio.Protocol]) -> asyncio.Protocol:
        """The protocol for a connection ``loop.create_server`` accepted; ``handlers`` makes aiohttp's."""
        return _Connection(self, handlers)

    async def track(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """Middleware: the connection has sent its headers, and is not shed while in a request."""
        transport = request.transport
        connection = self._open.get(transport) if transport is not None else None
        if connection is None:
            return await handler(request)
        connection.requested()
        self._idle.pop(connection, None)
        try:
            return await handler(request)
        finally:
            if connection.transport in self._open:
                self._idle[connection] = None

    def admit(self, connection: _Connection, transport: asyncio.BaseTransport) -> bool:
        """Count a new connection in, shedding the longest idle one at the cap; ``False``: refuse it."""
        if len(self._open) >= self.limit:
            if not self._idle:
                self._refused += 1
                self._report()
                return False
            victim = next(iter(self._idle))
            self.forget(victim)
            victim.abort()
            self._shed += 1
            self._report()
        self._open[transport] = connection
        self._idle[connection] = None
        return True

    def forget(self, connection: _Connection) -> None:
        if connection.transport is not None:
            self._open.pop(connection.transport, None)
        self._idle.pop(connection, None)

    def close(self) -> None:
        """Drop what aiohttp's shutdown left open (a peer that reads no answer) and report the rest."""
        for connection in list(self._open.values()):
            connection.abort()
        self._open.clear()
        self._idle.clear()
        if self._shed or self._refused:
            self._report(final=True)

    def _report(self, *, final: bool = False) -> None:
        now = asyncio.get_running_loop().time()
        if not final and self._reported is not None and now - self._reported < REPORT_INTERVAL:
            return
        self._reported = now
        log.warning(
            "endpoint server on %s is at its cap of %d connections: %d idle closed to admit new ones, "
            "%d new refused while all were in a request (this line comes at most once a minute)",
            self.address,
            self.limit,
            self._shed,
            self._refused,
        )
        self._shed = self._refused = 0


class _Connection(Wrapping):
    """One accepted connection: aiohttp's handler inside once admitted, and a deadline for its request."""

    def __init__(self, owner: Connections, handlers: Callable[[], asyncio.Protocol]) -> None:
        self._owner = owner
        self._handlers = handlers
        self.transport: asyncio.Transport | None = None
        self._inner: asyncio.Protocol | None = None
        self._deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream transport, from create_server: uvloop's is one without subclassing it.
        stream = self.transport = cast("asyncio.Transport", transport)
        if not self._owner.admit(self, stream):
            stream.abort()  # at once: the fd is what the cap protects
            return
        loop = asyncio.get_running_loop()
        self._deadline = loop.call_later(self._owner.idle_timeout, self._no_request)
        self._inner = self._handlers()
        self._inner.connection_made(transport)

    def requested(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _no_request(self) -> None:
        self._deadline = None
        if self.transport is not None:
            self.transport.close()  # nothing was answered yet, so nothing is left to flush

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        self.requested()
        self._owner.forget(self)
        if self._inner is not None:
            self._inner.connection_lost(exc)
