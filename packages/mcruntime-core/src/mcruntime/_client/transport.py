"""Sending requests to one API server: retries, the circuit, the shared session's turns.

Retries are decided here because only here is it known whether a request
reached the server: idempotent requests retry 429 (honouring Retry-After), 5xx
and connection failures with the backoff of ``retry.py``; other requests retry
only what provably never reached the server. The session and identity it sends
with are ``connection.py``'s; TLS material is ``tls.py``'s.
"""

from __future__ import annotations

import asyncio
import math
import ssl
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING
from urllib.parse import urljoin, urlsplit

from .._base.errors import APIError, Fenced, Unreachable
from .._reconcile.fence import write_refusal
from .connection import Connection
from .health import ProbeInconclusive, ProbeResult
from .http1 import AnswerTooLarge, RequestFailed
from .pool import NoTurn, Turns
from .retry import RETRY_STATUSES, refused_for_good, retry_after_seconds
from .retry import RetryPolicy as RetryPolicy  # a transport option, importable here too
from .wording import NoAnswer, Unsendable, describe_connection_error, is_client_error, unexpected

if TYPE_CHECKING:
    from .multiplex import WatchResponse
    from .session import ServerSession

_AIOHTTP_CEIL_THRESHOLD = 5.0
"""aiohttp rounds a deadline further than this many seconds away up to a whole second of the loop's clock."""

_READS = ("GET", "HEAD")
"""Methods a lapsed share may still send: reading races nobody."""

_LATE_LOOP = 1.0
"""A probe's timeout that fired this many seconds late (or half its timeout) says nothing about the server."""


class Transport(Connection):
    """One API server's HTTP session, credentials and health, and the requests sent over it.

    Everything above it speaks paths and bytes, so swapping the base client
    later stays a local change.
    """

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
            except Unsendable as failure:
                self.health.failure(failure.message)
                raise
            except NoAnswer as failure:
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
            if status >= 500 and refused_for_good(status, payload):
                return status, response_headers, payload  # the request's own fault: no retry, no blame
            if status in RETRY_STATUSES and (safe or status == 429) and attempt + 1 < self._retry.attempts:
                retry_after = retry_after_seconds(response_headers)
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
            except NoAnswer as failure:
                if failure.timed_out and failure.late > min(_LATE_LOOP, timeout / 2):
                    raise ProbeInconclusive(
                        f"no answer to GET /version in {timeout:g}s, but this process's event loop "
                        f"ran {failure.late:.1f}s late: the silence may be ours"
                    ) from None
                if failure.timed_out:
                    return f"no answer to GET /version in {timeout:g}s", True, failure.whole_server
                if failure.interrupted:  # the reason names the request that failed (another probe's)
                    return failure.message, True, failure.whole_server
                return f"GET /version failed: {failure.message}", True, failure.whole_server
            except Unsendable as error:  # our side cannot send it: the server may be fine
                return error.message, False
            except Unreachable as error:  # unusable TLS material, or the cluster was stopped
                return error.message, True
            except APIError as error:  # an answer refused for its size or a redirect: the server is up
                return error.message, False
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
        """One attempt; raises :class:`NoAnswer` when no response arrived (or the circuit cut it).

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
            message = unexpected(error, "getting the credential for", method, path)
            self.health.credential_error = message
            raise Unsendable(message, self.cluster) from None
        self.health.credential_error = None
        session = self._session
        if session is None:
            raise Unreachable("the cluster was stopped", cluster=self.cluster)
        # Our own HTTP/1.1 connections (http1.py), or aiohttp's where a proxy is in the way.
        pool = session.requests if method != "HEAD" else None
        response_headers: Mapping[str, str]
        total, connect = timeout, self._connect_timeout
        interrupted = False
        loop = asyncio.get_running_loop()
        sent_at = loop.time()
        status = 0
        turns = self._turns
        try:
            async with asyncio.timeout(None) as waiting:
                self._waiting.add(waiting)
                try:
                    if turns is not None:
                        total = await self._take_turn(turns, timeout, patient)
                        connect = min(total, connect)
                        sent_at = loop.time()
                    if method not in _READS and (refusal := write_refusal()) is not None:
                        # Checked last, after the wait for a turn: see _reconcile/fence.py.
                        message = f"not sending {method} {path}: {refusal}"
                        raise Fenced(message, cluster=self.cluster, reason="Fenced")
                    try:
                        if pool is not None:
                            async with asyncio.timeout(total):
                                status, response_headers, payload = await pool.request(
                                    method, path, params, headers, body, connect
                                )
                        else:
                            status, response_headers, payload = await self._send_by_aiohttp(
                                session, method, path, params, body, headers, total, connect
                            )
                        if turns is not None:
                            turns.answered()
                    finally:
                        if turns is not None:
                            turns.release()
                finally:
                    self._waiting.discard(waiting)
                    interrupted = waiting.expired()
        except (NoAnswer, Unreachable, Fenced):
            raise
        except AnswerTooLarge as refused:
            # The server's answer, not a lost connection: asked again, it would send the same.
            message = f"{method} {path}: {refused.message}; not asked again"
            self.health.failure(message, suspect=False)
            raise APIError(message, cluster=self.cluster, reason="AnswerTooLarge") from None
        except RequestFailed as refused:
            if interrupted:
                raise self._interrupted() from None
            # A connection refused or not made in time is the server's silence; a TLS handshake
            # refused is this cluster's trust or identity, and says nothing of the others'.
            whole_server = refused.timed_out or (refused.never_sent and not refused.tls)
            raise NoAnswer(refused.message, refused.never_sent, refused.timed_out, whole_server) from None
        except Exception as error:
            if not isinstance(error, TimeoutError | ssl.SSLError) and not is_client_error(error):
                # aiohttp's ValueError for a header it will not send, say: the same on every
                # attempt, so no retry; the cluster's health says what it was.
                raise Unsendable(unexpected(error, "sending", method, path), self.cluster) from None
            if interrupted:
                raise self._interrupted() from None
            never_sent = is_client_error(error, "ClientConnectorError")
            timed_out = isinstance(error, TimeoutError)
            # The server's own silence, not this cluster's TLS identity refused: all its clusters are cut off.
            whole_server = timed_out or (never_sent and not is_client_error(error, "ClientSSLError"))
            failure = NoAnswer(describe_connection_error(error), never_sent, timed_out, whole_server)
            if timed_out:
                # How much later than its deadline the timeout fired: our own event loop's lag.
                # (aiohttp rounds a deadline over 5 s up to a whole second of the loop's clock.)
                deadline = sent_at + total
                if pool is None and total > _AIOHTTP_CEIL_THRESHOLD:
                    deadline = math.ceil(deadline)
                failure.late = max(0.0, loop.time() - deadline)
            raise failure from None
        self.health.contact(status)
        if 300 <= status < 400:
            raise self._redirected(method, path, status, response_headers)
        return status, response_headers, payload

    def _interrupted(self) -> NoAnswer:
        """A request ended because the circuit opened, in the words of the verdict that opened it."""
        return NoAnswer(f"{self.interrupted_by}; the request was interrupted", False, False, interrupted=True)

    def _redirected(self, method: str, path: str, status: int, headers: Mapping[str, str]) -> APIError:
        """The error for a redirect, which is never followed.

        An API server does not redirect its API; an answer that does comes
        from a proxy or an impostor sending the client somewhere else, whose
        answer it would then trust. The error names where to, as an origin
        only: the Location's path and query may carry anything.
        """
        origin = _origin(self.server, headers.get("location"))
        message = f"{method} {path} answered {status}, a redirect to {origin}; redirects are not followed"
        self.health.failure(message, suspect=False)
        return APIError(message, cluster=self.cluster, status=status, reason="Redirect")

    async def _send_by_aiohttp(
        self,
        session: ServerSession,
        method: str,
        path: str,
        params: Mapping[str, str] | None,
        body: bytes | None,
        headers: Mapping[str, str],
        total: float,
        connect: float,
    ) -> tuple[int, Mapping[str, str], bytes]:
        """One request through aiohttp's client: a cluster behind a proxy, or a ``HEAD``."""
        import aiohttp  # imported where needed (session.py says why)

        async with session.http(self.cluster).request(
            method,
            self.server + path,
            params=params or None,
            data=body,
            headers=headers,
            timeout=aiohttp.ClientTimeout(total=total, connect=connect, sock_connect=connect),
            allow_redirects=False,  # a redirect is refused by _send, with where it pointed
            **session.http_options(),
        ) as response:
            return response.status, response.headers, await response.read()

    async def _take_turn(self, turns: Turns, timeout: float, patient: bool) -> float:
        """A place among the shared session's requests (see :meth:`Turns.wait_turn`); the time left."""
        try:
            remaining = await turns.wait_turn(self.cluster, timeout, patient)
        except NoTurn as failure:
            raise NoAnswer(str(failure), True, True, True) from None
        return timeout if remaining is None else remaining

    @asynccontextmanager
    async def stream(
        self,
        path: str,
        *,
        params: Mapping[str, str] | None = None,
        read_timeout: float | None = None,
        accept: str = "application/json",
    ) -> AsyncIterator[WatchResponse]:
        """Open a long-lived GET (a watch); ``read_timeout`` bounds silence on it.

        The caller checks the status; a silent watch raises a timeout within
        ``read_timeout`` instead of hanging forever. While the cluster is known
        to be unreachable no stream opens, and open ones are closed when that
        becomes known. Where the server speaks HTTP/2 the watch is a stream of
        a connection shared with its server's other watches (``multiplex.py``);
        otherwise it holds an HTTP/1.1 connection of its own.
        """
        self._fail_fast("GET", path)
        await self.open()
        assert self._credentials is not None
        headers = await self._headers(accept, None)
        multiplexer = self._multiplexer()
        if multiplexer is not None:
            from .multiplex import ChannelUnavailable

            try:
                stream = await multiplexer.open(path, params, headers, read_timeout, self._http2_context)
            except ChannelUnavailable as error:
                cause = error.error
                message = describe_connection_error(cause) if cause is not None else str(error)
                self.health.failure(message)
                raise Unreachable(message, cluster=self.cluster) from None
            if stream is not None:
                try:
                    async with self._watching(stream, path) as response:
                        yield response
                finally:
                    stream.close()
                return
        session = self._session
        if session is None:
            raise Unreachable("the cluster was stopped", cluster=self.cluster)
        import aiohttp  # only watches without HTTP/2 need it (session.py says why)

        timeout = aiohttp.ClientTimeout(
            total=None,
            connect=self._connect_timeout,
            sock_connect=self._connect_timeout,
            sock_read=read_timeout,
        )
        try:
            async with (
                session.http(self.cluster).get(
                    self.server + path,
                    params=params,
                    headers=headers,
                    timeout=timeout,
                    allow_redirects=False,  # refused by _watching: a watch goes to its own server only
                    **session.http_options(),
                ) as response,
                self._watching(response, path) as watched,
            ):
                yield watched
        except (aiohttp.ClientConnectorError, ssl.SSLError) as error:
            message = describe_connection_error(error)
            self.health.failure(message)
            raise Unreachable(message, cluster=self.cluster) from None

    @asynccontextmanager
    async def _watching(self, response: WatchResponse, path: str) -> AsyncIterator[WatchResponse]:
        """An open watch's response: counted as contact, refused if a redirect, closed with the circuit."""
        self.health.contact(response.status)
        if 300 <= response.status < 400:
            headers: Mapping[str, str] = getattr(response, "headers", None) or {}
            raise self._redirected("GET", path, response.status, headers)
        if response.status == 401:
            assert self._credentials is not None
            self._credentials.invalidate()
        self._streams.add(response)
        try:
            yield response
        finally:
            self._streams.discard(response)


def _origin(server: str, location: str | None) -> str:
    """``scheme://host:port`` of a redirect's target (relative to ``server``), or why it is not told."""
    if not location:
        return "nowhere (no Location)"
    try:
        target = urlsplit(urljoin(server, location.strip()))
        host, port = target.hostname, target.port
    except ValueError:
        return "an unreadable Location"
    scheme = target.scheme.lower()
    if not host or scheme not in ("http", "https"):
        return "a Location that is no http(s) URL"
    if len(host) > 253 or not host.isascii() or not host.isprintable():
        return f"{scheme}://(a host name that is not printable)"
    literal = f"[{host}]" if ":" in host else host
    return f"{scheme}://{literal}:{port or (443 if scheme == 'https' else 80)}"
