"""The session and identity one cluster uses to reach its API server.

A :class:`Connection` turns a :class:`ClusterConfig` into a session
(``session.py``) with the right TLS context and an ``Authorization`` header that stays fresh
(token files are re-read when they change, exec plugins re-run before expiry
and after a 401), shares that session with clusters that reach the same server
the same way (``pool.py``), and swaps it when a client certificate rotates.
Sending over it, with retries and the circuit, is ``transport.py``'s.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import ssl
from collections.abc import Awaitable, Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from .._base.errors import Unreachable
from .._config.credentials import ClusterCredentials
from .._config.exec import ExecLimits
from .._config.kubeconfig import ClusterConfig, redacted_url
from .._config.material import MaterialFiles
from .health import HealthRecord
from .pool import REQUESTS_IN_FLIGHT, Turns, close_session, companion, session_pool
from .retry import RetryPolicy
from .session import ServerSession
from .tls import MaterialPaths, certificate_of, tune_tls_read_buffer
from .wording import describe_connection_error

if TYPE_CHECKING:
    # Imported where used: kubernetes-asyncio's generated models take ~0.3 s and
    # ~35 MiB to import, and only typed-API users need them.
    from kubernetes_asyncio import client as k8s_client

    from .multiplex import Multiplexer, WatchResponse

log = logging.getLogger("mcruntime.transport")

_CONNECT_TIMEOUT = 5.0


class Connection:
    """One cluster's HTTP session, credentials and health; open, then close once."""

    def __init__(
        self,
        config: ClusterConfig,
        cluster: str,
        *,
        request_timeout: float = 30.0,
        retry: RetryPolicy | None = None,
        connect_timeout: float = _CONNECT_TIMEOUT,
        share_connections: bool = True,
        exec_limits: ExecLimits | None = None,
        requests_in_flight: int = REQUESTS_IN_FLIGHT,
        http2_watches: bool = True,
    ) -> None:
        self.config: ClusterConfig = config
        self._exec_limits = exec_limits or ExecLimits()
        self.cluster = cluster
        self.health: HealthRecord = HealthRecord(cluster)
        self.health.open_listeners.append(self._interrupt)
        self._preparing: int = 0  # requests waiting on something shared before they are sent (see preparing)
        self.health.outstanding = lambda: bool(self._waiting) or self._preparing > 0
        self._request_timeout = request_timeout
        self._connect_timeout = connect_timeout
        # Requests waiting on the server and open watches, interrupted when the circuit opens.
        self._waiting: set[asyncio.Timeout] = set()
        self._streams: set[WatchResponse] = set()
        self._http2 = http2_watches
        self._user: Mapping[str, Any] | None = None  # the user entry of a certificate from _swap_context
        self._mux: Multiplexer | None = None  # the HTTP/2 connections of the last watch opened
        self._retry = retry or RetryPolicy()
        self._material: MaterialFiles | None = None
        self._session: ServerSession | None = None
        # The sharing key of self._session when it is a pooled one (see pool.py), else None.
        self._lease: str | None = None
        # The shared session's requests in flight (see pool.py); None when unshared.
        self._turns: Turns | None = None
        self._share = share_connections
        self._requests_in_flight = requests_in_flight
        # Sessions replaced by a certificate rotation, with their sharing keys: their
        # open watches keep running on the old identity until they reconnect; closed
        # (or given back) with the transport.
        self._retired: list[tuple[str | None, ServerSession]] = []
        self._credentials: ClusterCredentials | None = None
        self._closing: set[asyncio.Task[None]] = set()
        self._paths: MaterialPaths | None = None
        self._open_lock = asyncio.Lock()
        self._closed = False
        self.interrupted_by: str = "the circuit opened"

    def __repr__(self) -> str:
        return f"<Transport cluster={self.cluster!r} server={redacted_url(self.config.server)}>"

    @contextmanager
    def preparing(self) -> Iterator[None]:
        """A request of this cluster waits, for the block, on work shared with its server's others.

        Discovery loaded once for a whole server, say: the request follows
        when it is done, so the health probe treats it as on its way and does
        not spend a probe of its own on vouching for the cluster meanwhile.
        """
        self._preparing += 1
        try:
            yield
        finally:
            self._preparing -= 1

    @property
    def server(self) -> str:
        return self.config.server

    # --- lifetime --------------------------------------------------------------

    async def open(self) -> None:
        """Build the TLS context (or find a shared session) and the HTTP session."""
        if self._session is not None and not self._closed:
            return  # every request calls this: once open, no lock (5 % of a 10,000-cluster engage)
        async with self._open_lock:
            if self._closed:
                raise Unreachable("the cluster was stopped", cluster=self.cluster)
            if self._session is not None:
                return
            tune_tls_read_buffer()
            material = MaterialFiles()
            self._material = material
            self._paths = MaterialPaths(material)
            self._credentials = self._new_credentials(self.config)
            key = self._sharing_key()
            if key is None:
                self._session = self._new_session(await self._build_context(material))
                return
            async with session_pool().opening(key):  # one TLS context per key, not per cluster
                shared = session_pool().existing(key)
                if shared is not None:  # same server, same trust, identity per request: no handshake
                    self._session, self._lease = shared, key
                    self._turns = session_pool().turns(key)
                    return
                context = await self._build_context(material)
                self._session = session_pool().lease(
                    key, lambda: self._new_session(context), self._requests_in_flight
                )
                self._lease = key
                self._turns = session_pool().turns(key)

    async def _build_context(self, material: MaterialFiles) -> ssl.SSLContext:
        """This transport's TLS context, built off the event loop; fails as :class:`Unreachable`."""
        try:
            context = await asyncio.to_thread(self._ssl_context)
        except BaseException as error:
            self._discard_material(material)
            if isinstance(error, Exception) and self.closed:
                raise Unreachable("the cluster was stopped", cluster=self.cluster) from None
            if isinstance(error, ssl.SSLError | OSError | ValueError):  # a CA that is no certificate, say
                message = f"unusable TLS configuration: {describe_connection_error(error)}"
                raise Unreachable(message, cluster=self.cluster) from None
            raise
        if self.closed:  # closed while the TLS context was being built: open nothing
            self._discard_material(material)
            raise Unreachable("the cluster was stopped", cluster=self.cluster)
        return context

    def _sharing_key(self) -> str | None:
        """The key this transport's session is shared under, or ``None`` if it keeps its own.

        The endpoint decides, and so does the identity when it is part of the
        TLS handshake: clusters with a client certificate share only with
        clusters whose user entry is the very same (a certificate from an exec
        plugin moves to a session of its own when it arrives).
        """
        if not self._share:
            return None
        endpoint = self.config.endpoint_fingerprint()
        if certificate_of(self.config.user) == (None, None):
            return endpoint  # the identity travels per request, in a header
        return f"{endpoint}/{self.config.credential_fingerprint()}"

    @property
    def shared(self) -> bool:
        """Whether this transport's connections are pooled with other clusters' (same server and trust)."""
        return self._lease is not None

    def _new_session(self, context: ssl.SSLContext) -> ServerSession:
        return ServerSession(self.server, context, self.config.cluster)

    def _new_credentials(
        self, config: ClusterConfig, prepare: Callable[[], Awaitable[None]] | None = None
    ) -> ClusterCredentials:
        return ClusterCredentials(
            config,
            self.cluster,
            use_certificate=self._use_certificate,
            prepare=prepare,
            exec_limits=self._exec_limits,
            waiting=self.health.waiting,
        )

    async def close(self) -> None:
        """Close every connection (watches included), kill exec plugins, drop key material.

        A closed transport stays closed: later requests fail with :class:`Unreachable`
        instead of quietly opening a session nobody would close.
        """
        self._closed = True
        credentials = self._credentials
        if credentials is not None:
            await credentials.close()
        for closing in list(self._closing):
            await closing
        self._interrupt("the cluster was stopped")  # a pooled session outlives this transport
        session, self._session = self._session, None
        lease, self._lease = self._lease, None
        self._turns = None
        retired, self._retired = self._retired, []
        for key, old in [*retired, (lease, session)]:
            if old is None:
                continue
            if key is None:
                await close_session(old)
            else:
                await session_pool().release(key, old)
        if self._material is not None:
            self._discard_material(self._material)

    def _discard_material(self, material: MaterialFiles) -> None:
        """Drop the in-memory files of a closed, failed or abandoned ``open``."""
        material.close()
        if self._material is material:
            self._material = None
            self._paths = None

    @property
    def closed(self) -> bool:
        return self._closed

    def _ssl_context(self, user: Mapping[str, Any] | None = None) -> ssl.SSLContext:
        assert self._paths is not None
        user = self.config.user if user is None else user
        return self._paths.ssl_context(self.cluster, self.config.cluster, user)

    async def _use_certificate(self, certificate: bytes, key: bytes) -> None:
        """Present a new client certificate on new connections (an exec plugin's, say)."""
        assert self._material is not None
        user = {
            "client-certificate-data": base64.b64encode(certificate).decode(),
            "client-key-data": base64.b64encode(key).decode(),
        }
        await self._swap_context(user)

    async def _swap_context(self, user: Mapping[str, Any]) -> None:
        """A new TLS context and session for ``user``'s certificate; caches above are untouched.

        A fresh session rather than ``load_cert_chain`` on the shared context:
        pooled keep-alive connections would otherwise go on authenticating as
        the old identity. Open watches keep their connection until they
        reconnect (through the new session); the old session closes with the
        transport.
        """
        try:
            context = await asyncio.to_thread(self._ssl_context, user)
        except (ssl.SSLError, OSError, ValueError) as error:
            message = f"unusable client certificate: {describe_connection_error(error)}"
            self.health.failure(message)
            raise Unreachable(message, cluster=self.cluster) from None
        if self._closed or self._session is None:
            return
        self._user = user
        old, self._session = self._session, self._new_session(context)
        old_lease, self._lease = self._lease, None  # a certificate identity never shares
        self._turns = None
        self._retired.append((old_lease, old))
        while len(self._retired) > 2:  # bound them: a watch this old has reconnected long since
            key, oldest = self._retired.pop(0)
            if key is None:
                await close_session(oldest)
            else:
                await session_pool().release(key, oldest)

    async def kubernetes_configuration(self) -> k8s_client.Configuration:
        """An isolated kubernetes-asyncio ``Configuration`` for typed API calls.

        For code that wants the generated API classes; its certificate and key
        paths are this transport's in-memory files (``/proc/self/fd/N``), valid
        in this process until the transport closes. The Authorization header is
        a snapshot: prefer the mcruntime client.
        """
        if self._material is None:
            raise RuntimeError(f"cluster {self.cluster!r}: the transport is not open")
        assert self._credentials is not None and self._paths is not None
        return self._paths.kubernetes_configuration(self.server, self.config, await self.authorization())

    def replace_credentials(self, config: ClusterConfig) -> None:
        """Use ``config``'s user from the next request on (same endpoint, new credential).

        A changed client certificate or key gets a new TLS context before the
        next request (new connections present it); a running exec plugin of the
        old user is killed.
        """
        old_config, self.config = self.config, config
        old = self._credentials
        if self._material is None:
            return  # not open: open() builds everything from the new config
        prepare = None
        if certificate_of(config.user) != certificate_of(old_config.user) and (
            certificate_of(config.user) != (None, None)
        ):
            user = config.user

            async def prepare() -> None:
                await self._swap_context(user)

        self._credentials = self._new_credentials(config, prepare)
        if old is not None and old.plugin is not None:
            # Kill the old user's plugin run, if any; held here until done so it is not collected.
            closing = asyncio.get_running_loop().create_task(
                old.close(), name=f"credentials-close:{self.cluster}"
            )
            self._closing.add(closing)
            closing.add_done_callback(self._closing.discard)

    def redact(self, raw: bytes) -> bytes:
        """``raw`` (an error answer's body) without the credential this connection sends."""
        secret = self._credentials.sent_secret() if self._credentials is not None else None
        if not secret or not raw:
            return raw
        return raw.replace(secret.encode(), b"[redacted]")

    async def authorization(self) -> str | None:
        """The current Authorization header value (for interop; never log it)."""
        assert self._credentials is not None
        return await self._credentials.header()

    # --- requests ----------------------------------------------------------------

    async def _headers(self, accept: str, content_type: str | None) -> dict[str, str]:
        headers = {"Accept": accept}
        if content_type:
            headers["Content-Type"] = content_type
        assert self._credentials is not None
        authorization = await self._credentials.header()
        if authorization:
            headers["Authorization"] = authorization
        return headers

    def _multiplexer(self) -> Multiplexer | None:
        """The HTTP/2 connections this cluster's watches open on, or ``None`` to use HTTP/1.1.

        Shared with the session (and so with every cluster sharing it). Not
        for a server behind a proxy (the proxy speaks HTTP/1.1 CONNECT), nor
        for plain HTTP, nor once the server has answered without ``h2``.
        """
        session = self._session
        if not self._http2 or session is None or self.config.cluster.get("proxy-url"):
            return None
        if not self.server.startswith("https://"):
            return None
        from .multiplex import Multiplexer  # HTTP/2 (hpack) is imported with the first watch

        found = companion(
            session,
            lambda: Multiplexer(
                self.server,
                server_hostname=self.config.cluster.get("tls-server-name"),
                connect_timeout=self._connect_timeout,
            ),
        )
        if found.unsupported is not None or found.closed:
            return None
        self._mux = found
        return found

    async def _http2_context(self) -> ssl.SSLContext:
        """A TLS context like the session's, offering ``h2`` (the session's must stay HTTP/1.1)."""
        paths, user = self._paths, self._user or self.config.user
        if paths is None:  # stopped while its watch was opening
            raise Unreachable("the cluster was stopped", cluster=self.cluster)

        def build() -> ssl.SSLContext:
            context = paths.ssl_context(self.cluster, self.config.cluster, user)
            context.set_alpn_protocols(["h2"])
            return context

        try:
            return await asyncio.to_thread(build)
        except (ssl.SSLError, OSError, ValueError) as error:
            message = f"unusable TLS configuration: {describe_connection_error(error)}"
            raise Unreachable(message, cluster=self.cluster) from None

    def _interrupt(self, reason: str) -> None:
        """The circuit opened: end every request waiting on the server and every watch."""
        # Kept for the interrupted requests' errors: by the time they run, a probe may
        # already have closed the circuit again and cleared the health's reason.
        self.interrupted_by = reason
        if self._waiting:
            now = asyncio.get_running_loop().time()
            for waiting in list(self._waiting):
                # One the circuit already ended (opened, closed, opened again before that
                # request ran) is on its way out; rescheduling it would raise and leave the rest.
                if not waiting.expired():
                    waiting.reschedule(now)
        for response in list(self._streams):
            response.close()
        if self._mux is not None and not self._closed:
            # A connection the server went silent on would otherwise carry the next
            # watches until each read timeout: an unanswered PING drops it.
            self._mux.check_alive()
