"""The webhook server: one HTTPS port, one path per cluster, a lane per cluster.

Each engaged cluster's API server calls a path that names the cluster::

    /clusters/{cluster}/validate/{group}/{version}/{kind}
    /clusters/{cluster}/mutate/{group}/{version}/{kind}
    /clusters/{cluster}/convert/{group}/{kind}

(``core`` stands for the empty group, ``_local`` for the manager's own cluster).
The handler runs with that cluster's name in :class:`AdmissionRequest` and with
the reconcile context set to it, so ``mgr.client`` reads that cluster's cache
exactly as inside a reconcile.

Every input is bounded: the body (3 MiB, the API server's own limit), its type
(``application/json``), its shape (a 400 naming the wrong field), and the time
a call may take, waiting for its lane included. Each cluster has a lane of
``max_concurrent_per_cluster`` calls: a handler that hangs for one cluster
holds that lane only, and the other clusters' calls never wait behind it. A
handler that raises answers per its ``on_error`` and is logged with the cluster
and the object; the server itself never stops answering.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING
from urllib.parse import quote, unquote

from aiohttp import web

from .._base.kind import Kind
from .._base.permissions import ROLES, Permission
from .._fleet.cluster import Cluster
from .._reconcile.request import LOCAL_CLUSTER
from . import h2conn
from .accept import Accepted, Open
from .calling import (
    HandlerMisuse,
    as_json,
    cancelled_here,
    failed,
    in_context,
    lane_timeout,
    not_served,
    now,
    resume,
    run_handler,
)
from .certs import CertificateFiles, CertificateSource, SelfSignedCertificates
from .converting import Converting
from .exchange import BodyLost, BodyTooLarge, Call, Reply, answer_limit, caller_timeout
from .h2conn import Http2Connection
from .handlers import AdmissionHook, Conversion
from .metrics import UNMATCHED, WebhookMetrics
from .options import WebhookOptions
from .registration import CRD, MUTATING, VALIDATING, Registrar
from .review import (
    JSON,
    AdmissionRequest,
    Denied,
    ReviewError,
    admission_response,
    conversion_response,
    decode,
    encode,
    parse_admission,
    parse_conversion,
    snapshot,
)

if TYPE_CHECKING:
    from collections.abc import Awaitable

    from prometheus_client import CollectorRegistry

log = logging.getLogger("mcruntime.webhook")

LOCAL_PATH = "_local"
"""How the manager's own cluster (named ``""``) appears in a webhook path."""
CORE_GROUP = "core"
"""How the core (empty) API group appears in a webhook path."""
_NAMED_AT_MOST = 1024  # clusters whose refused calls are remembered as logged
_WARNED_AT_MOST = 16  # of those, how many get a WARNING (a fleet's departed clusters, not a flood)


def cluster_path(cluster: str) -> str:
    """The path segment naming ``cluster``."""
    return LOCAL_PATH if cluster == LOCAL_CLUSTER else quote(cluster, safe="")


def _cluster_from_path(segment: str) -> str:
    return LOCAL_CLUSTER if segment == LOCAL_PATH else unquote(segment)


def group_path(group: str) -> str:
    """The path segment naming an API group."""
    return group or CORE_GROUP


def _with(hosts: tuple[str, ...], host: str) -> tuple[str, ...]:
    """The certificate's hosts, with the one the API servers call (or its URL would not verify)."""
    return hosts if host in hosts else (*hosts, host)


class WebhookServer:
    """Serves every registered admission and conversion webhook for every engaged cluster.

    The manager owns one (``mgr.webhook``): it starts listening before any
    cluster is engaged, engages it with every cluster (for the lanes and the
    registration), supervises its certificate loop and stops it last.
    """

    def __init__(
        self,
        options: WebhookOptions | None = None,
        *,
        clusters: Callable[[], Mapping[str, Cluster]],
        field_manager: str = "mcruntime-webhook",
        registry: CollectorRegistry | None = None,
    ) -> None:
        self.options: WebhookOptions = options or WebhookOptions()
        self._metrics = WebhookMetrics(registry) if registry is not None else None
        self._clusters = clusters
        files = self.options.files()
        self.certificates: CertificateSource = (
            CertificateFiles(*files)
            if files is not None
            else SelfSignedCertificates(
                _with(self.options.hosts, self.options.public_host()),
                validity=self.options.certificate_validity,
            )
        )
        self.validators: dict[Kind, AdmissionHook] = {}
        self.defaulters: dict[Kind, AdmissionHook] = {}
        self.conversions: dict[tuple[str, str], Conversion] = {}
        self._lanes: dict[str, asyncio.Semaphore] = {}
        self._runner: web.AppRunner | None = None
        self._listener: asyncio.Server | None = None
        self._open: Open = {}
        self._h2_open: set[Http2Connection] = set()
        self._closing = False  # calls cut short from now on are answered, per their on_error
        self._http1_calls: set[asyncio.Task[object]] = set()  # the tasks serving HTTP/1.1 calls now
        self._unengaged_named: set[str] = set()  # clusters whose calls were refused, logged once each
        self.port: int | None = None
        self.registrar: Registrar = Registrar(self, field_manager=field_manager)
        self._converting = Converting(self.options.max_concurrent_per_cluster)

    def __repr__(self) -> str:
        where = f"port {self.port}" if self.port is not None else "not listening"
        return f"<WebhookServer {where} validators={len(self.validators)} defaulters={len(self.defaulters)}>"

    # --- registering handlers -----------------------------------------------------------

    def add_admission(self, hook: AdmissionHook) -> None:
        """Serve ``hook``'s validator and defaulter (one each per kind)."""
        for table, handler, what in (
            (self.validators, hook.validator, "validator"),
            (self.defaulters, hook.defaulter, "defaulter"),
        ):
            if handler is not None and hook.kind in table:
                raise ValueError(f"a {what} for {hook.kind} is already registered")
        if hook.validator is not None:
            self.validators[hook.kind] = hook
        if hook.defaulter is not None:
            self.defaulters[hook.kind] = hook
        self.registrar.changed()

    def add_conversion(self, conversion: Conversion) -> None:
        """Serve conversion between the versions of one group and kind."""
        key = (conversion.group, conversion.kind)
        if key in self.conversions:
            raise ValueError(f"a conversion for {conversion.kind}.{conversion.group} is already registered")
        self.conversions[key] = conversion
        self.registrar.changed()

    @property
    def has_handlers(self) -> bool:
        """Whether anything is registered (the manager starts the server only then, unless configured)."""
        return bool(self.validators or self.defaulters or self.conversions)

    def rbac_rules(self) -> list[Permission]:
        """What registering needs in every cluster it registers in (``mcruntime.rbac_for`` reads it).

        Nothing when the server does not register (user-provided certificates:
        whoever issued them installs the configurations).
        """
        if not self.options.registers:
            return []
        verbs: tuple[str, ...] = ("get", "create", "update", "patch")
        if self.options.remove_on_disengage:
            verbs = (*verbs, "delete")
        wanted: list[tuple[Kind, tuple[str, ...], str]] = []
        if self.validators:
            wanted.append((VALIDATING, verbs, "registers the validating webhooks"))
        if self.defaulters:
            wanted.append((MUTATING, verbs, "registers the mutating webhooks"))
        if self.conversions:
            wanted.append((CRD, ("get", "patch"), "sets the CRDs' conversion webhook"))
        found = [
            Permission(kind, kind_verbs, role=role, reason=reason)
            for role in ROLES
            for kind, kind_verbs, reason in wanted
        ]
        # A configuration of a kind with no handlers now, left by an earlier version with
        # failurePolicy Fail, refuses every write it matches: this one, by name, may empty it.
        name = (self.options.configuration_name,)
        for kind, hooks in ((VALIDATING, self.validators), (MUTATING, self.defaulters)):
            if not hooks and (self.validators or self.defaulters or self.conversions):
                why = f"empties the {kind.kind} an earlier version left, if any"
                verbs = ("get", "patch")
                found += [Permission(kind, verbs, r, reason=why, resource_names=name) for r in ROLES]
        return found

    # --- addresses ------------------------------------------------------------------------

    def base_url(self, cluster: str) -> str:
        """``https://host:port/clusters/<cluster>``: where ``cluster``'s API server calls."""
        if self.port is None:
            raise RuntimeError("the webhook server is not listening yet")
        host = self.options.public_host()
        host = f"[{host}]" if ":" in host else host
        return f"https://{host}:{self.port}/clusters/{cluster_path(cluster)}"

    def admission_url(self, cluster: str, kind: Kind, *, mutating: bool) -> str:
        """The URL of ``kind``'s validating (or mutating) webhook for ``cluster``."""
        verb = "mutate" if mutating else "validate"
        return f"{self.base_url(cluster)}/{verb}/{group_path(kind.group)}/{kind.version}/{kind.kind}"

    def conversion_url(self, cluster: str, group: str, kind: str) -> str:
        """The URL of the conversion webhook of ``kind`` in ``group`` for ``cluster``."""
        return f"{self.base_url(cluster)}/convert/{group_path(group)}/{kind}"

    def ca_bundle(self) -> bytes | None:
        """The PEM CA bundle API servers must trust (``None`` with user-provided certificates)."""
        return self.certificates.ca_bundle()

    # --- lifetime -------------------------------------------------------------------------

    async def listen(self) -> None:
        """Load the certificate and bind the port (idempotent); raises if either fails."""
        if self._runner is not None:
            return
        await self.certificates.load()
        app = web.Application(client_max_size=self.options.max_body_bytes)
        app.router.add_route("*", "/{path:.*}", self._http1)
        # aiohttp keeps an idle HTTP/1.1 connection (half a request's headers included) for an
        # hour by default: the same bound as an HTTP/2 connection's instead.
        runner = web.AppRunner(
            app,
            access_log=None,
            handle_signals=False,
            shutdown_timeout=1.0,
            keepalive_timeout=h2conn.IDLE_TIMEOUT,
        )
        await runner.setup()
        handlers = runner.server
        assert handlers is not None  # set by setup()
        options = self.options

        def http2() -> Http2Connection:
            return Http2Connection(
                self.serve,
                max_streams=options.max_streams_per_connection,
                max_body=options.max_body_bytes,
                settle=options.handler_timeout,
            )

        self.certificates.context.set_alpn_protocols(["h2", "http/1.1"] if options.http2 else ["http/1.1"])
        try:
            listener = await asyncio.get_running_loop().create_server(
                lambda: Accepted(handlers, http2 if options.http2 else None, self._open, self._h2_open),
                options.listen_host,
                options.listen_port,
                ssl=self.certificates.context,
                backlog=128,
            )
        except OSError as error:
            await runner.cleanup()
            raise OSError(f"webhook server cannot listen on {self.options.address}: {error}") from error
        self._runner, self._listener = runner, listener
        self.port = listener.sockets[0].getsockname()[1] if listener.sockets else self.options.listen_port
        log.info("webhook server listening on %s:%s", self.options.listen_host, self.port)

    async def run(self) -> None:
        """Keep the certificate current until cancelled (the manager supervises this loop)."""
        await self.listen()
        while True:
            await asyncio.sleep(self.options.reload_interval)
            if await self.certificates.refresh() and self.certificates.ca_bundle() is not None:
                self.registrar.changed()

    async def rotate_certificate(self) -> None:
        """Renew a self-made serving certificate now (files are reloaded when they change)."""
        if isinstance(self.certificates, SelfSignedCertificates):
            await self.certificates.rotate()
        else:
            await self.certificates.refresh()

    async def close(self, *, grace: float = 1.0) -> int:
        """Stop listening; calls in flight get ``grace`` seconds, then answers per their ``on_error``.

        A call cut short is answered (and logged), never dropped: a dropped call
        is an API server error the client cannot read, or, under
        ``failurePolicy: Ignore``, an object admitted unchecked. The manager
        gives what is left of its graceful shutdown timeout (each call ends by
        its own deadline in any case). Returns how many calls were cut short.
        """
        self._closing = True
        runner, self._runner = self._runner, None
        listener, self._listener = self._listener, None
        if listener is not None:
            listener.close()
        for connection in list(self._h2_open):
            connection.drain()  # GOAWAY: the client opens nothing more here; calls in flight finish
        await self._settled(timeout=min(grace, self.options.handler_timeout + 1.0))
        cut = [task for task in self._http1_calls if not task.done()]
        for task in cut:
            task.cancel()
        cut += [task for connection in list(self._h2_open) for task in connection.cancel_calls()]
        if cut:  # each answers per its on_error (see _answer), then its connection closes
            await asyncio.wait(cut, timeout=1.0)
        if runner is not None:
            await runner.cleanup()  # aiohttp's connections, idle by now
        if self._h2_open:
            await self._h2_drained(timeout=1.0)
        # What is left is waiting on a peer's TLS goodbye (or was accepted as we closed): drop it now.
        lingering = list(self._open.items())
        for transport, _gone in lingering:
            transport.abort()
        if lingering:
            await asyncio.wait([gone for _transport, gone in lingering], timeout=1.0)
        self._open.clear()
        self._h2_open.clear()
        self.port = None
        self._closing = False
        return len(cut)

    async def _settled(self, timeout: float) -> None:
        """Wait until no call is in flight, over either protocol (at most ``timeout``)."""
        transports = [connection.transport for connection in self._h2_open]
        waits: list[asyncio.Future[None] | asyncio.Task[object]] = [
            self._open[transport] for transport in transports if transport in self._open
        ]
        waits += [task for task in self._http1_calls if task is not asyncio.current_task()]
        if waits:
            await asyncio.wait(waits, timeout=timeout)

    async def _h2_drained(self, timeout: float) -> None:
        """Wait until the HTTP/2 connections' calls in flight are answered (at most ``timeout``)."""
        transports = [connection.transport for connection in self._h2_open]
        gone = [self._open[transport] for transport in transports if transport in self._open]
        if gone:
            await asyncio.wait(gone, timeout=timeout)

    # --- clusters -------------------------------------------------------------------------

    async def engage(self, name: str, cluster: Cluster) -> None:
        """Open ``name``'s lane and keep its configurations current (when registering)."""
        self._lanes[name] = asyncio.Semaphore(self.options.max_concurrent_per_cluster)
        self._unengaged_named.discard(name)  # refused again after it leaves: logged again

        def forget() -> None:
            if self._clusters().get(name) in (None, cluster):
                self._lanes.pop(name, None)
                self._unengaged_named.discard(name)

        cluster.on_stop(forget)
        if self.options.registers:
            self.registrar.engage(name, cluster)

    async def readiness(self) -> list[tuple[str, str | None, bool]]:
        """``/readyz`` lines: listening, the certificate's expiry (in its name), failing registrations."""
        lines: list[tuple[str, str | None, bool]] = [
            ("webhook", None if self.port is not None else "not listening", True)
        ]
        expires = self.certificates.not_after()
        if expires is not None:
            now = datetime.datetime.now(datetime.UTC)
            reason = None if expires > now else f"the serving certificate expired at {expires.isoformat()}"
            lines.append(
                (f"webhook:certificate (expires {expires.isoformat(timespec='seconds')})", reason, True)
            )
        # Shown, not counted: one cluster refusing its configuration must not take the server out of service.
        for name, error in sorted(self.registrar.failing.items()):
            lines.append((f"webhook:registration:{name or 'local'}", error, False))
        return lines

    # --- calls ----------------------------------------------------------------------------

    async def _http1(self, request: web.Request) -> web.StreamResponse:
        """Aiohttp's side: the request as a :class:`Call`, the :class:`Reply` as a response."""

        async def read() -> bytes:
            try:
                return await request.read()
            except web.HTTPRequestEntityTooLarge:
                raise BodyTooLarge from None
            except ConnectionResetError:  # the client went away mid-body, as a reset HTTP/2 stream
                raise BodyLost from None

        content_type = request.content_type if request.headers.get("Content-Type") else ""
        path, timeout = request.raw_path.partition("?")[0], caller_timeout(request.query_string)
        task = asyncio.current_task()  # aiohttp's connection task: close() cuts it short, if need be
        if task is not None:
            self._http1_calls.add(task)
        try:
            reply = await self.serve(Call(request.method, path, content_type, read, timeout))
        finally:
            self._http1_calls.discard(task)
        headers = {"Content-Type": reply.content_type}
        return web.Response(status=reply.status, body=reply.body, headers=headers)

    async def serve(self, call: Call) -> Reply:
        """Route and answer one call, whichever protocol carried it (and count it, with a registry)."""
        webhook, answer = self._route(call)
        if self._metrics is not None:
            return await self._metrics.measure(webhook, answer)
        return await answer

    def _route(self, call: Call) -> tuple[str, Awaitable[Reply]]:
        """The call's webhook (its metrics label) and the coroutine that answers it."""
        parts = call.path.split("/")
        if len(parts) < 5 or parts[0] or parts[1] != "clusters":
            return UNMATCHED, now(not_served(call))
        cluster, verb, rest = _cluster_from_path(parts[2]), parts[3], [unquote(part) for part in parts[4:]]
        shape = {"validate": 3, "mutate": 3, "convert": 2}.get(verb)
        if len(rest) != shape:
            return UNMATCHED, now(not_served(call))
        handler, what = self._lookup(verb, rest)
        webhook = f"/{verb}/{'/'.join(rest)}" if handler is not None else UNMATCHED
        if call.method != "POST":
            reply = Reply.text(405, f"{call.method} is not served: API servers call webhooks with POST")
            return webhook, now(reply)
        if handler is None:
            return webhook, now(Reply.text(404, f"no {what}"))
        lane = self._lanes.get(cluster) if cluster in self._clusters() else None
        if lane is None:  # answered as a review, so that the API server shows the client why
            return webhook, self._unengaged(call, cluster, handler)
        if isinstance(handler, Conversion):
            return webhook, self._convert(call, cluster, lane, handler)
        return webhook, self._admit(call, cluster, lane, handler, mutating=verb == "mutate")

    async def _unengaged(self, call: Call, name: str, handler: AdmissionHook | Conversion) -> Reply:
        """A call for a cluster this manager does not serve (gone, not yet engaged, or never known).

        Answered per the webhook's ``on_error`` (a conversion fails), with a
        message the API server passes on: a bare 404 reached the client as
        "the server could not find the requested resource".
        """
        message = f"cluster {name or '(local)'!r} is not engaged with this manager"
        if name not in self._unengaged_named:
            if len(self._unengaged_named) >= _NAMED_AT_MOST:
                self._unengaged_named.clear()  # a caller inventing names costs a bounded set
            self._unengaged_named.add(name)
            # WARNING for the first few names: a caller inventing names must not flood the log.
            level = logging.WARNING if len(self._unengaged_named) <= _WARNED_AT_MOST else logging.DEBUG
            log.log(level, "webhook call refused: %s", message)
        else:
            log.debug("webhook call refused: %s", message)
        data = await self._read(call)
        if isinstance(data, Reply):
            return data
        if isinstance(handler, Conversion):
            try:
                review = parse_conversion(name, data)
            except ReviewError as error:
                return Reply.text(400, str(error))
            return as_json(conversion_response(review.uid, None, message))
        try:
            admission = parse_admission(name, data)
        except ReviewError as error:
            return Reply.text(400, str(error))
        answer = failed(handler, admission, message)
        return answer if isinstance(answer, Reply) else as_json(answer)

    def _lookup(self, verb: str, rest: list[str]) -> tuple[AdmissionHook | Conversion | None, str]:
        """What is registered at ``/verb/...``, and what a 404 names when nothing is."""
        if verb == "convert":
            group, kind = rest
            found = self.conversions.get(("" if group == CORE_GROUP else group, kind))
            return found, f"conversion webhook is registered for {kind}.{group}"
        group, version, kind_name = rest
        admitted = Kind(version if group == CORE_GROUP else f"{group}/{version}", kind_name)
        mutating = verb == "mutate"
        hook = (self.defaulters if mutating else self.validators).get(admitted)
        return hook, f"{'mutating' if mutating else 'validating'} webhook is registered for {admitted}"

    async def _read(self, call: Call) -> JSON | Reply:
        if call.content_type != "application/json":
            return Reply.text(
                415, f"content type {call.content_type or '(none)'!r} is not served; send application/json"
            )
        try:
            async with asyncio.timeout(self.options.handler_timeout):
                body = await call.read()
        except BodyTooLarge:
            return Reply.text(
                413,
                f"the body is larger than {self.options.max_body_bytes} bytes, the most a webhook accepts",
            )
        except BodyLost:
            return Reply.text(400, "the client gave up on the call before its body ended")
        except TimeoutError:
            return Reply.text(408, f"the body did not arrive within {self.options.handler_timeout}s")
        try:
            return decode(body)
        except ReviewError as error:
            return Reply.text(400, str(error))

    async def _admit(
        self, call: Call, name: str, lane: asyncio.Semaphore, hook: AdmissionHook, *, mutating: bool
    ) -> Reply:
        data = await self._read(call)
        if isinstance(data, Reply):
            return data
        try:
            review = parse_admission(name, data)
        except ReviewError as error:
            return Reply.text(400, str(error))
        limit = answer_limit(call, self.options.handler_timeout)
        answer = await self._answer(hook, review, lane, mutating=mutating, limit=limit)
        return answer if isinstance(answer, Reply) else Reply(200, encode(answer))

    async def _answer(
        self,
        hook: AdmissionHook,
        review: AdmissionRequest,
        lane: asyncio.Semaphore,
        *,
        mutating: bool,
        limit: float | None = None,
    ) -> JSON | Reply:
        what = "defaulter" if mutating else "validator"
        try:
            original = snapshot(review.object) if mutating else None
        except TypeError as error:  # orjson reads deeper nesting than it writes (254 levels)
            return failed(hook, review, f"the object cannot be copied for the {what}: {error}")
        limit = self.options.handler_timeout if limit is None else limit
        deadline = asyncio.timeout(limit)
        loop = asyncio.get_running_loop()
        began, ran = loop.time(), None  # ran: when the call got its lane, and the handler began
        try:
            async with deadline, lane:
                ran = loop.time()
                result = await in_context(review, run_handler(hook, review, mutating=mutating))
        except asyncio.CancelledError as error:
            if cancelled_here():
                if not self._closing:
                    raise
                resume()
                cut = "the webhook server is shutting down"
                log.warning("webhook %s for %s cut short: %s", what, review, cut)
                return failed(hook, review, f"the {what} was cut short: {cut}")
            log.error("webhook %s for %s raised", what, review, exc_info=error)
            return failed(hook, review, f"the {what} failed: CancelledError")
        except Denied as denial:
            return admission_response(
                review, allowed=False, message=denial.message, code=denial.code, reason=denial.reason
            )
        except TimeoutError as error:
            if not deadline.expired():  # the handler's own timeout (a slow call it made): its error
                log.error("webhook %s for %s raised", what, review, exc_info=error)
                return failed(hook, review, f"the {what} failed: {type(error).__name__}")
            # The lane's wait counts against the limit: say which of the two took the time, or a
            # flood from one cluster would read as a slow handler.
            width = self.options.max_concurrent_per_cluster
            message = lane_timeout(what, review.cluster, width, limit, began, ran)
            log.error("webhook %s for %s: %s", what, review, message)
            return failed(hook, review, message)
        except Exception as error:
            log.error("webhook %s for %s raised", what, review, exc_info=error)
            said = f"TypeError: {error}" if isinstance(error, HandlerMisuse) else type(error).__name__
            return failed(hook, review, f"the {what} failed: {said}")
        try:
            return admission_response(review, allowed=True, original=original, defaulted=result)
        except TypeError as error:  # a value that is not JSON (a set, say), or nesting too deep
            log.error("webhook %s for %s: its object cannot be encoded as JSON: %s", what, review, error)
            return failed(hook, review, f"the {what}'s object cannot be encoded as JSON: {error}")

    async def _convert(self, call: Call, name: str, lane: asyncio.Semaphore, conversion: Conversion) -> Reply:
        data = await self._read(call)
        if isinstance(data, Reply):
            return data
        try:
            review = parse_conversion(name, data)
        except ReviewError as error:
            return Reply.text(400, str(error))
        limit = answer_limit(call, self.options.handler_timeout)
        return await self._converting.answer(
            name, review, conversion, lane, limit=limit, closing=lambda: self._closing
        )
