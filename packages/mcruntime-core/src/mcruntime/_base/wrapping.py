"""A protocol that wraps another: the servers' way to watch a connection without touching its handler.

The webhook server picks HTTP/2 or HTTP/1.1 per connection and records each
until its socket is gone; the endpoint server counts its connections and times
their first request. Both put a protocol of their own in front of aiohttp's (or
our HTTP/2) handler; the traffic itself is passed through untouched.
"""

from __future__ import annotations

import asyncio


class Wrapping(asyncio.Protocol):
    """Passes data, EOF and flow control through to ``_inner`` once it is set (in ``connection_made``)."""

    _inner: asyncio.Protocol | None = None

    def data_received(self, data: bytes) -> None:
        if self._inner is not None:
            self._inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self._inner.eof_received() if self._inner is not None else None

    def pause_writing(self) -> None:
        if self._inner is not None:
            self._inner.pause_writing()

    def resume_writing(self) -> None:
        if self._inner is not None:
            self._inner.resume_writing()
