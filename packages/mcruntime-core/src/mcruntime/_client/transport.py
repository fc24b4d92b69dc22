"""An authenticated HTTP connection to one API server.

This is the seam between mcruntime and the HTTP stack: it turns a
:class:`ClusterConfig` into an aiohttp session with the right TLS context and an
``Authorization`` header that stays fresh (token files are re-read when they
change, exec plugins re-run before expiry and after a 401). Everything above it
speaks paths and bytes, so swapping the base client later stays a local change.

Retries live here because only here is it known whether a request reached the
server: idempotent requests retry 429 (honouring Retry-After), 5xx and
connection failures with jittered exponential backoff; other requests retry
only what provably never reached the server.
"""

from __future__ import annotations

import asyncio
import asyncio.sslproto
import base64
import logging
import os
import ssl
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import aiohttp

from .._base.backoff import Backoff
from .._base.errors import Unreachable
from .._config.credentials import _Credentials
from .._config.exec import ExecLimits
from .._config.kubeconfig import ClusterConfig, _redacted
from .._config.material import MaterialFiles
from .failures import _describe_connection_error, _unexpected
from .health import HealthRecord, ProbeResult
from .pool import REQUESTS_IN_FLIGHT, Turns, session_pool

if TYPE_CHECKING:
    # Imported where used: kubernetes-asyncio's generated models take ~0.3 s and
    # ~35 MiB to import, and only typed-API users need them.
    from kubernetes_asyncio import client as k8s_client

_KEEPALIVE_SECONDS = 75.0
# Aborted TLS connections leaked in CPython until gh-118960 (3.12.8, 3.13.1); aiohttp's
# workaround for that is deprecated where the fix is in (a DeprecationWarning on every
# session, an error under -W error), so it is asked for only where it is still needed.
_CLEANUP_CLOSED = sys.version_info < (3, 12, 8) or (3, 13, 0) <= sys.version_info < (3, 13, 1)
"""How long an idle pooled connection is kept (aiohttp's default is 15 s)."""

log = logging.getLogger("mcruntime.transport")

_RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})
_CONNECT_TIMEOUT = 5.0
_STDLIB_TLS_READ_BUFFER = 256 * 1024
_tls_buffer_tuned = False


def _tune_tls_read_buffer() -> None:
    """Lower asyncio's per-connection TLS read buffer from 256 KiB to 64 KiB, once per process.

    Every TLS connection asyncio makes allocates (and zero-fills, so it is
    resident) a read buffer of ``SSLProtocol.max_size``, and a fleet holds a
    watch connection per cluster and kind: at 256 KiB that buffer was most of
    an idle cluster's memory. TLS records carry at most 16 KiB, so 64 KiB
    reads lose nothing. The setting is the process's, so it is only lowered
    from the standard library's own default; ``MCRUNTIME_TLS_READ_BUFFER_KIB``
    chooses another size (256 keeps the default).
    """
    global _tls_buffer_tuned
    if _tls_buffer_tuned:
        return
    _tls_buffer_tuned = True
    raw = os.environ.get("MCRUNTIME_TLS_READ_BUFFER_KIB", "64")
    try:
        size = int(raw) * 1024
    except ValueError:
        log.warning("MCRUNTIME_TLS_READ_BUFFER_KIB=%r is not a whole number of KiB; keeping 64", raw)
        size = 64 * 1024
    protocol = getattr(asyncio.sslproto, "SSLProtocol", None)
    if size > 0 and getattr(protocol, "max_size", None) == _STDLIB_TLS_READ_BUFFER:
        protocol.max_size = size  # type: ignore[union-attr]


@dataclass(frozen=True)
class RetryPolicy:
    """How hard to retry a request that may succeed a moment later."""

    attempts: int = 5
    base_delay: float = 0.2
    max_delay: float = 10.0

    def delay(self, attempt: int, retry_after: float | None = None) -> float:
        """Full-jitter capped backoff (the one :class:`Backoff`), never shorter than Retry-After."""
        backoff = Backoff(base=self.base_delay, cap=max(self.max_delay, self.base_delay), jitter=1.0)
        return max(backoff.delay(attempt), retry_after or 0.0)


class Transport:
    """One API server's HTTP session, credentials and health; open, then close once."""

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
    ) -> None:
        self.config: ClusterConfig = config
        self._exec_limits = exec_limits or ExecLimits()
        self.cluster = cluster
        self.health: HealthRecord = HealthRecord(cluster)
        self.health.open_listeners.append(self._interrupt)
        self._request_timeout = request_timeout
        self._connect_timeout = connect_timeout
        # Requests waiting on the server and open watches, interrupted when the circuit opens.
        self._waiting: set[asyncio.Timeout] = set()
        self._streams: set[aiohttp.ClientResponse] = set()
        self._retry = retry or RetryPolicy()
        self._material: MaterialFiles | None = None
        self._session: aiohttp.ClientSession | None = None
        # The sharing key of self._session when it is a pooled one (see pool.py), else None.
        self._lease: str | None = None
        # The shared session's requests in flight (see pool.py); None when unshared.
        self._turns: Turns | None = None
        self._share = share_connections
        self._requests_in_flight = requests_in_flight
        # Sessions replaced by a certificate rotation, with their sharing keys: their
        # open watches keep running on the old identity until they reconnect; closed
        # (or given back) with the transport.
        self._retired: list[tuple[str | None, aiohttp.ClientSession]] = []
        self._credentials: _Credentials | None = None
        self._closing: set[asyncio.Task[None]] = set()
        self._files: dict[str, str] = {}
        self._open_lock = asyncio.Lock()
        self._closed = False
        self._timeouts: dict[float, aiohttp.ClientTimeout] = {}

    def __repr__(self) -> str:
        return f"<Transport cluster={self.cluster!r} server={_redacted(self.config.server)}>"

    @property
    def server(self) -> str:
        return self.config.server

    # --- lifetime --------------------------------------------------------------

    async def open(self) -> None:
        """Load the key material into memory, build the TLS context and the HTTP session."""
        async with self._open_lock:
            if self._closed:
                raise Unreachable("the cluster was stopped", cluster=self.cluster)
            if self._session is not None:
                return
            _tune_tls_read_buffer()
            material = MaterialFiles()
            self._material = material
            self._credentials = self._new_credentials(self.config)
            key = self._sharing_key()
            if key is not None:
                shared = session_pool().existing(key)
                if shared is not None:  # same server, same trust, identity per request: no handshake
                    self._session, self._lease = shared, key
                    self._turns = session_pool().turns(key)
                    return
            try:
                context = await asyncio.to_thread(self._ssl_context)
            except BaseException as error:
                self._discard_material(material)
                if isinstance(error, Exception) and self.closed:
                    raise Unreachable("the cluster was stopped", cluster=self.cluster) from None
                if isinstance(error, ssl.SSLError | OSError | ValueError):  # a CA that is no certificate, say
                    message = f"unusable TLS configuration: {_describe_connection_error(error)}"
                    raise Unreachable(message, cluster=self.cluster) from None
                raise
            if self.closed:  # closed while the TLS context was being built: open nothing
                self._discard_material(material)
                raise Unreachable("the cluster was stopped", cluster=self.cluster)
            if key is None:
                self._session = self._new_session(context)
            else:
                self._session = session_pool().lease(
                    key, lambda: self._new_session(context), self._requests_in_flight
                )
                self._lease = key
                self._turns = session_pool().turns(key)

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
        if _certificate_of(self.config.user) == (None, None):
            return endpoint  # the identity travels per request, in a header
        return f"{endpoint}/{self.config.credential_fingerprint()}"

    @property
    def shared(self) -> bool:
        """Whether this transport's connections are pooled with other clusters' (same server and trust)."""
        return self._lease is not None

    def _new_session(self, context: ssl.SSLContext) -> aiohttp.ClientSession:
        # Idle connections stay open longer than the slowest paced probe interval of a
        # large fleet (20 s at 1,000 clusters), so a probe reuses one instead of paying a
        # TLS handshake, which costs ten times the request itself.
        connector = aiohttp.TCPConnector(
            ssl=context, limit=0, enable_cleanup_closed=_CLEANUP_CLOSED, keepalive_timeout=_KEEPALIVE_SECONDS
        )
        return aiohttp.ClientSession(
            connector=connector,
            trust_env=False,  # a cluster's proxy comes from its kubeconfig, not the environment
            skip_auto_headers=("User-Agent",),
            headers={"User-Agent": "mcruntime"},
        )

    def _new_credentials(
        self, config: ClusterConfig, prepare: Callable[[], Awaitable[None]] | None = None
    ) -> _Credentials:
        return _Credentials(
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
                await old.close()
            else:
                await session_pool().release(key, old)
        if self._material is not None:
            self._discard_material(self._material)

    def _discard_material(self, material: MaterialFiles) -> None:
        """Drop the in-memory files of a closed, failed or abandoned ``open``."""
        material.close()
        if self._material is material:
            self._material = None
            self._files.clear()

    @property
    def closed(self) -> bool:
        return self._closed

    def _material_file(self, field_name: str, entry: Mapping[str, Any]) -> str | None:
        """A path holding a certificate or key.

        The referenced file, or inline data put once into an in-memory file
        (memfd: nothing on disk, gone with the process however it ends).
        """
        data_field = f"{field_name}-data"
        if entry.get(data_field):
            key = f"{field_name}:{entry[data_field]}"
            if key not in self._files:
                assert self._material is not None
                data = base64.b64decode(str(entry[data_field]).replace("\r", "").replace("\n", ""))
                self._files[key] = self._material.path(field_name, data)
            return self._files[key]
        path = entry.get(field_name)
        return str(path) if path else None

    def _ssl_context(self, user: Mapping[str, Any] | None = None) -> ssl.SSLContext:
        cluster = self.config.cluster
        user = self.config.user if user is None else user
        ca_file = self._material_file("certificate-authority", cluster)
        context = ssl.create_default_context(cafile=ca_file)
        # Python 3.13 made its defaults stricter than client-go's verifier (a CA without
        # key identifiers is refused); kubectl trusts such clusters, so we do too.
        context.verify_flags &= ~ssl.VERIFY_X509_STRICT
        if cluster.get("insecure-skip-tls-verify"):
            log.warning("cluster %r: TLS verification is disabled by its kubeconfig", self.cluster)
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        cert = self._material_file("client-certificate", user)
        key = self._material_file("client-key", user)
        if cert and key:
            context.load_cert_chain(cert, key)
        return context

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
            message = f"unusable client certificate: {_describe_connection_error(error)}"
            self.health.failure(message)
            raise Unreachable(message, cluster=self.cluster) from None
        if self._closed or self._session is None:
            return
        old, self._session = self._session, self._new_session(context)
        old_lease, self._lease = self._lease, None  # a certificate identity never shares
        self._turns = None
        self._retired.append((old_lease, old))
        while len(self._retired) > 2:  # bound them: a watch this old has reconnected long since
            key, oldest = self._retired.pop(0)
            if key is None:
                await oldest.close()
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
        assert self._credentials is not None
        from kubernetes_asyncio import client as k8s_client

        configuration = k8s_client.Configuration(host=self.server)
        configuration.ssl_ca_cert = self._material_file("certificate-authority", self.config.cluster)
        configuration.cert_file = self._material_file("client-certificate", self.config.user)
        configuration.key_file = self._material_file("client-key", self.config.user)
        configuration.verify_ssl = not self.config.cluster.get("insecure-skip-tls-verify")
        if self.config.cluster.get("tls-server-name"):
            configuration.tls_server_name = self.config.cluster["tls-server-name"]
        if self.config.cluster.get("proxy-url"):
            configuration.proxy = self.config.cluster["proxy-url"]
        authorization = await self.authorization()
        if authorization and authorization.startswith("Bearer "):
            configuration.api_key["BearerToken"] = authorization
        return configuration

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
        if _certificate_of(config.user) != _certificate_of(old_config.user) and (
            _certificate_of(config.user) != (None, None)
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

    def _request_options(self) -> dict[str, Any]:
        options: dict[str, Any] = {}
        if self.config.cluster.get("proxy-url"):
            options["proxy"] = self.config.cluster["proxy-url"]
        if self.config.cluster.get("tls-server-name"):
            options["server_hostname"] = self.config.cluster["tls-server-name"]
        return options

    def _timeout(self, total: float) -> aiohttp.ClientTimeout:
        """The aiohttp timeout of one request; one object per distinct total, made once."""
        found = self._timeouts.get(total)
        if found is None:
            if len(self._timeouts) > 16:  # totals shrunk by a wait for a turn vary: keep few
                self._timeouts.clear()
            found = self._timeouts[total] = aiohttp.ClientTimeout(
                total=total, connect=self._connect_timeout, sock_connect=self._connect_timeout
            )
        return found

    async def request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, str] | None = None,
        body: bytes | None = None,
        content_type: str | None = None,
        accept: str = "application/json",
        idempotent: bool | None = None,
        timeout: float | None = None,
    ) -> tuple[int, Mapping[str, str], bytes]:
        """Send one request (with retries) and return status, headers and body.

        Non-2xx statuses are returned, not raised: the client maps them to typed
        errors with the object they concern. Raises :class:`Unreachable` when no
        response arrived after the retries, and at once while the cluster is
        known to be unreachable (its health probe gets no answer): a request to
        a hung server must not hold a worker for its whole timeout.
        """
        trial = self._fail_fast(method, path, trial=True)
        try:
            return await self._request(
                method, path, params, body, content_type, accept, idempotent, timeout, trial
            )
        finally:
            if trial:
                self.health.end_trial(answered=not self.health.unreachable)

    async def _request(
        self,
        method: str,
        path: str,
        params: Mapping[str, str] | None,
        body: bytes | None,
        content_type: str | None,
        accept: str,
        idempotent: bool | None,
        timeout: float | None,
        trial: bool,
    ) -> tuple[int, Mapping[str, str], bytes]:
        """:meth:`request`'s attempts; a ``trial`` through the open circuit gets one (the probe's timeout)."""
        await self.open()
        assert self._credentials is not None
        safe = idempotent if idempotent is not None else method in ("GET", "HEAD", "PUT", "DELETE")
        timeout = timeout or self._request_timeout
        if trial:
            timeout = min(timeout, self.health.trial_timeout)
        reauthenticated = False
        attempt = 0
        while True:
            try:
                status, response_headers, payload = await self._send(
                    method, path, params, body, content_type, accept, timeout
                )
            except _Unsendable as failure:
                self.health.failure(failure.message)
                raise
            except _NoAnswer as failure:
                if self._closed:  # cut by close(): the cluster stopped, the server did nothing wrong
                    raise Unreachable("the cluster was stopped", cluster=self.cluster) from None
                self.health.failure(failure.message, suspect=not trial)  # a failed trial: the circuit is open
                if trial:
                    raise Unreachable(
                        f"{failure.message} (a trial through the open circuit)", cluster=self.cluster
                    ) from None
                if (safe or failure.never_sent) and attempt + 1 < self._retry.attempts:
                    await asyncio.sleep(self._retry.delay(attempt))
                    attempt += 1
                    self._fail_fast(method, path)
                    continue
                raise Unreachable(failure.message, cluster=self.cluster) from None
            if status == 401:
                if not reauthenticated:
                    # A rotated token file or an expired exec credential: fetch it anew once.
                    self._credentials.invalidate()
                    reauthenticated = True
                    continue
                self.health.credentials_rejected(
                    f"credentials rejected: {method} {path} answered 401 Unauthorized"
                )
            if status in _RETRY_STATUSES and (safe or status == 429) and attempt + 1 < self._retry.attempts:
                retry_after = _retry_after(response_headers)
                await asyncio.sleep(self._retry.delay(attempt, retry_after))
                attempt += 1
                self._fail_fast(method, path)
                continue
            if status >= 500:
                self.health.failure(f"HTTP {status} on {method} {path}")
            return status, response_headers, payload

    async def probe(self, timeout: float) -> ProbeResult:
        """One ``GET /version`` for the health probe: ``None`` if it answered 200.

        Otherwise returns what failed, worded for a person, and whether the
        server gave no answer at all (which opens the circuit), and whether that
        silence is the server's own (a timeout or a refused connection, which
        opens the circuit of every cluster of the server). It bypasses the
        circuit (it is what closes it) and does not retry: the probe's cadence
        is its retry. A 401 is retried once with a fresh credential, as every
        request is, so a rotated token file does not count as a rejection.
        Behind a shared session's queue it waits its turn while the server
        answers others, and ``timeout`` starts with its turn: a burst of
        probes from many clusters of one server must not call it unreachable.
        """
        for attempt in range(2):
            try:
                await self.open()
                assert self._credentials is not None
                status, _headers, _body = await self._send(
                    "GET", "/version", None, None, None, "application/json", timeout, patient=True
                )
            except _NoAnswer as failure:
                if failure.timed_out:
                    return f"no answer to GET /version in {timeout:g}s", True, failure.whole_server
                return f"GET /version failed: {failure.message}", True, failure.whole_server
            except _Unsendable as error:  # our side cannot send it: the server may be fine
                return error.message, False
            except Unreachable as error:  # unusable TLS material, or the cluster was stopped
                return error.message, True
            if status == 200:
                return None
            if status == 401 and attempt == 0:
                self._credentials.invalidate()
                continue
            if status in (401, 403):
                phrase = "Unauthorized" if status == 401 else "Forbidden"
                return f"credentials rejected: GET /version answered {status} {phrase}", False
            return f"GET /version answered {status}", False
        return "credentials rejected: GET /version answered 401 Unauthorized", False

    def _fail_fast(self, method: str, path: str, *, trial: bool = False) -> bool:
        """Refuse while the circuit is open; ``True`` when this request is its half-open trial.

        With ``trial`` the request may be the one let through the open circuit
        (see :meth:`HealthRecord.take_trial`); its caller must end the trial.
        """
        if not self.health.unreachable:
            return False
        if trial and self.health.take_trial():
            return True
        raise Unreachable(
            f"{self.health.reason}; not sending {method} {path} until the server answers again",
            cluster=self.cluster,
        )

    async def _send(
        self,
        method: str,
        path: str,
        params: Mapping[str, str] | None,
        body: bytes | None,
        content_type: str | None,
        accept: str,
        timeout: float,
        patient: bool = False,
    ) -> tuple[int, Mapping[str, str], bytes]:
        """One attempt; raises :class:`_NoAnswer` when no response arrived (or the circuit cut it).

        ``patient``: wait for a turn while the shared session's queue moves
        (see :meth:`_take_turn`).
        """
        try:
            headers = await self._headers(accept, content_type)
        except Unreachable as error:  # an exec plugin or token file that failed, named by its error
            if not self._closed:
                self.health.credential_error = error.message
            raise
        except Exception as error:  # a credential source that broke in a way nobody foresaw
            message = _unexpected(error, "getting the credential for", method, path)
            self.health.credential_error = message
            raise _Unsendable(message, self.cluster) from None
        self.health.credential_error = None
        session = self._session
        if session is None:
            raise Unreachable("the cluster was stopped", cluster=self.cluster)
        client_timeout = self._timeout(timeout)
        interrupted = False
        status = 0
        turns = self._turns
        try:
            async with asyncio.timeout(None) as waiting:
                self._waiting.add(waiting)
                try:
                    if turns is not None:
                        client_timeout = await self._take_turn(turns, timeout, patient)
                    try:
                        async with session.request(
                            method,
                            self.server + path,
                            params=params or None,
                            data=body,
                            headers=headers,
                            timeout=client_timeout,
                            **self._request_options(),
                        ) as response:
                            payload = await response.read()
                            status = response.status
                            response_headers: Mapping[str, str] = response.headers  # immutable, kept as is
                        if turns is not None:
                            turns.answered()
                    finally:
                        if turns is not None:
                            turns.release()
                finally:
                    self._waiting.discard(waiting)
                    interrupted = waiting.expired()
        except (_NoAnswer, Unreachable):
            raise
        except (aiohttp.ClientError, TimeoutError, ssl.SSLError) as error:
            if interrupted:
                raise _NoAnswer(f"{self.health.reason}; the request was interrupted", False, False) from None
            never_sent = isinstance(error, aiohttp.ClientConnectorError)
            timed_out = isinstance(error, TimeoutError)
            # The server's own silence, not this cluster's TLS identity refused: all its clusters are cut off.
            whole_server = timed_out or (never_sent and not isinstance(error, aiohttp.ClientSSLError))
            raise _NoAnswer(_describe_connection_error(error), never_sent, timed_out, whole_server) from None
        except Exception as error:
            # aiohttp's ValueError for a header it will not send, say: the same on every
            # attempt, so no retry; the cluster's health says what it was.
            raise _Unsendable(_unexpected(error, "sending", method, path), self.cluster) from None
        self.health.contact(status)
        return status, response_headers, payload

    async def _take_turn(self, turns: Turns, timeout: float, patient: bool) -> aiohttp.ClientTimeout:
        """Wait for a place among the shared session's requests in flight; the timeout that remains.

        The wait counts against the request's own ``timeout``, so a queue
        behind a hung server fails like the server itself would. A
        ``patient`` request (the health probe) waits on while the queue
        moves, and its timeout starts with its turn: a server that answers
        others is busy, not unreachable.
        """
        if turns.free:
            turns.take()  # a free place: taken at once, no task, no wait
            return self._timeout(timeout)
        loop = asyncio.get_running_loop()
        began = loop.time()
        acquiring = asyncio.ensure_future(turns.acquire(self.cluster))
        try:
            while True:
                await asyncio.wait({acquiring}, timeout=timeout)
                if acquiring.done():
                    break
                if not (patient and turns.moving(timeout)):
                    raise _NoAnswer(
                        f"no turn to send in {loop.time() - began:.3g}s "
                        f"({turns.limit} requests to the server in flight and no answer)",
                        True,
                        True,
                        True,
                    )
        except BaseException:
            if acquiring.done() and not acquiring.cancelled() and acquiring.exception() is None:
                turns.release()  # it came through as we gave up: hand it back
            else:
                acquiring.cancel()  # a place granted meanwhile is handed on by acquire()
            raise
        remaining = timeout if patient else max(0.001, timeout - (loop.time() - began))
        return aiohttp.ClientTimeout(
            total=remaining,
            connect=min(remaining, self._connect_timeout),
            sock_connect=min(remaining, self._connect_timeout),
        )

    def _interrupt(self, reason: str) -> None:
        """The circuit opened: end every request waiting on the server and every watch."""
        if self._waiting:
            now = asyncio.get_running_loop().time()
            for waiting in list(self._waiting):
                waiting.reschedule(now)
        for response in list(self._streams):
            response.close()

    @asynccontextmanager
    async def stream(
        self,
        path: str,
        *,
        params: Mapping[str, str] | None = None,
        read_timeout: float | None = None,
        accept: str = "application/json",
    ) -> AsyncIterator[aiohttp.ClientResponse]:
        """Open a long-lived GET (a watch); ``read_timeout`` bounds silence on the socket.

        The caller checks the status; a silent connection raises a timeout within
        ``read_timeout`` instead of hanging forever. While the cluster is known
        to be unreachable no stream opens, and open ones are closed when that
        becomes known.
        """
        self._fail_fast("GET", path)
        await self.open()
        assert self._credentials is not None
        headers = await self._headers(accept, None)
        session = self._session
        if session is None:
            raise Unreachable("the cluster was stopped", cluster=self.cluster)
        timeout = aiohttp.ClientTimeout(
            total=None,
            connect=self._connect_timeout,
            sock_connect=self._connect_timeout,
            sock_read=read_timeout,
        )
        try:
            async with session.get(
                self.server + path, params=params, headers=headers, timeout=timeout, **self._request_options()
            ) as response:
                self.health.contact(response.status)
                if response.status == 401:
                    self._credentials.invalidate()
                self._streams.add(response)
                try:
                    yield response
                finally:
                    self._streams.discard(response)
        except (aiohttp.ClientConnectorError, ssl.SSLError) as error:
            message = _describe_connection_error(error)
            self.health.failure(message)
            raise Unreachable(message, cluster=self.cluster) from None


class _Unsendable(Unreachable):
    """The request could not be built or handed to the HTTP client; retrying would not help."""

    def __init__(self, message: str, cluster: str) -> None:
        super().__init__(message, cluster=cluster)


class _NoAnswer(Exception):
    """One attempt got no response, and why.

    Whether it surely never reached the server, whether it timed out, and
    whether the server itself is silent (rather than this cluster's TLS
    identity refused).
    """

    def __init__(self, message: str, never_sent: bool, timed_out: bool, whole_server: bool = False) -> None:
        super().__init__(message)
        self.message = message
        self.never_sent = never_sent
        self.timed_out = timed_out
        self.whole_server = whole_server


def _retry_after(headers: Mapping[str, str]) -> float | None:
    value = headers.get("Retry-After")
    if value is None:
        return None
    try:
        return min(float(value), 60.0)
    except ValueError:
        return None


def _certificate_of(user: Mapping[str, Any]) -> tuple[Any, Any]:
    return (
        user.get("client-certificate-data") or user.get("client-certificate"),
        user.get("client-key-data") or user.get("client-key"),
    )
