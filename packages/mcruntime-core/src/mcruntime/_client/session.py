"""What one cluster's requests and watches go over: our connections, and aiohttp's where needed.

A :class:`ServerSession` is made per endpoint and TLS identity, and shared by
the clusters that may share it (``pool.py``). Requests go over its
:class:`~mcruntime._client.http1.RequestPool`; watches go over HTTP/2
(``multiplex.py``, kept with the session as its companion). aiohttp's client
session is made, and aiohttp imported, only when something needs it: a
watch on a server without HTTP/2, or a cluster behind a proxy (aiohttp speaks
CONNECT). A process whose servers speak HTTP/2 never imports it, which saves
about 60 ms of CPU at start-up, most of it two TLS contexts aiohttp builds
when it is imported and mcruntime never uses.
"""

from __future__ import annotations

import ssl
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from .._base.errors import Unreachable
from .http1 import RequestPool

if TYPE_CHECKING:
    import aiohttp

_KEEPALIVE_SECONDS = 75.0
"""How long an idle connection is kept (aiohttp's default is 15 s)."""
# Aborted TLS connections leaked in CPython until gh-118960 (3.12.8, 3.13.1); aiohttp's
# workaround for that is deprecated where the fix is in (a DeprecationWarning on every
# session, an error under -W error), so it is asked for only where it is still needed.
_CLEANUP_CLOSED = sys.version_info < (3, 12, 8) or (3, 13, 0) <= sys.version_info < (3, 13, 1)


class ServerSession:
    """Connections to one server with one TLS context; close it once.

    Idle connections stay open longer than the slowest paced probe interval
    of a large fleet (20 s at 1,000 clusters), so a probe reuses one instead
    of paying a TLS handshake, which costs ten times the request itself.
    """

    def __init__(self, server: str, context: ssl.SSLContext, cluster: Mapping[str, Any]) -> None:
        """``cluster`` is the kubeconfig's cluster entry: its proxy and TLS server name count."""
        self.server = server
        self._context = context
        self._proxy: str | None = cluster.get("proxy-url") or None
        self._server_hostname: str | None = cluster.get("tls-server-name") or None
        self._http: aiohttp.ClientSession | None = None
        self.closed = False
        self.requests: RequestPool | None = None
        """Where requests go; ``None`` behind a proxy (they go through :meth:`http`)."""
        if self._proxy is None:
            try:
                self.requests = RequestPool(
                    server, context, server_hostname=self._server_hostname, keepalive=_KEEPALIVE_SECONDS
                )
            except ValueError:  # a URL with no host: aiohttp's requests fail with their own words
                self.requests = None

    def __repr__(self) -> str:
        return f"<ServerSession requests={self.requests!r} aiohttp={self._http is not None}>"

    def http(self, cluster: str) -> aiohttp.ClientSession:
        """The aiohttp session with this context, made (and aiohttp imported) on first use.

        ``cluster`` is the asking cluster's name. A closed session refuses with
        :class:`~mcruntime.Unreachable` rather than make an aiohttp session that
        nobody would close.
        """
        if self.closed:
            raise Unreachable("the cluster was stopped", cluster=cluster)
        if self._http is None:
            import aiohttp  # deferred: see the module's docstring

            connector = aiohttp.TCPConnector(
                ssl=self._context,
                limit=0,
                enable_cleanup_closed=_CLEANUP_CLOSED,
                keepalive_timeout=_KEEPALIVE_SECONDS,
            )
            self._http = aiohttp.ClientSession(
                connector=connector,
                trust_env=False,  # a cluster's proxy comes from its kubeconfig, not the environment
                skip_auto_headers=("User-Agent",),
                headers={"User-Agent": "mcruntime"},
            )
        return self._http

    def http_options(self) -> dict[str, Any]:
        """The per-request options aiohttp needs for this cluster entry."""
        options: dict[str, Any] = {}
        if self._proxy is not None:
            options["proxy"] = self._proxy
        if self._server_hostname is not None:
            options["server_hostname"] = self._server_hostname
        return options

    async def close(self) -> None:
        """Close every connection, ours and aiohttp's."""
        self.closed = True
        if self.requests is not None:
            self.requests.close()
        if self._http is not None:
            await self._http.close()
