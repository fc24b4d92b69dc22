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
from typing import TYPE_CHECKING, cast
from urllib.parse import quote, unquote

from aiohttp import web

from .._base.kind import Kind
from .._base.permissions import ROLES, Permission
from .._fleet.cluster import Cluster
from .._reconcile.context import enter_reconcile, leave_reconcile
from .._reconcile.request import LOCAL_CLUSTER, Request
from .certs import CertificateFiles, CertificateSource, SelfSignedCertificates
from .handlers import AdmissionHook, Conversion, ConversionFailed
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

log = logging.getLogger("mcruntime.webhook")

LOCAL_PATH = "_local"
"""How the manager's own cluster (named ``""``) appears in a webhook path."""
CORE_GROUP = "core"
"""How the core (empty) API group appears in a webhook path."""


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


_Open = dict[asyncio.Transport, "asyncio.Future[None]"]
"""The connections a server holds, each with a future that is done when its socket is gone."""


class _Tracked(asyncio.Protocol):
    """Forwards to aiohttp's handler and records the connection until its socket is gone.

    aiohttp closes a TLS connection politely (close_notify, then wait for the
    peer's). A peer that never answers would keep the socket open for the SSL
    shutdown timeout, past ``close()`` and past the event loop; the record lets
    ``close()`` abort what is still open after the grace period.
    """

    def __init__(self, inner: asyncio.Protocol, open_: _Open) -> None:
        self._inner = inner
        self._open = open_
        self._transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream transport, from create_server: uvloop's is one without subclassing it.
        stream = self._transport = cast("asyncio.Transport", transport)
        self._open[stream] = asyncio.get_running_loop().create_future()
        self._inner.connection_made(transport)

    def connection_lost(self, exc: Exception | None) -> None:
        gone = self._open.pop(self._transport, None) if self._transport is not None else None
        if gone is not None and not gone.done():
            gone.set_result(None)
        self._inner.connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        self._inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self._inner.eof_received()

    def pause_writing(self) -> None:
        self._inner.pause_writing()

    def resume_writing(self) -> None:
        self._inner.resume_writing()


def _refuse(status: int, message: str) -> web.Response:
    return web.Response(status=status, text=message + "\n", content_type="text/plain")


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
    ) -> None:
        self.options: WebhookOptions = options or WebhookOptions()
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
        self._open: _Open = {}
        self.port: int | None = None
        self.registrar: Registrar = Registrar(self, field_manager=field_manager)

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
        return [
            Permission(kind, kind_verbs, role=role, reason=reason)
            for role in ROLES
            for kind, kind_verbs, reason in wanted
        ]

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
        app.add_routes(
            [
                web.post("/clusters/{cluster}/validate/{group}/{version}/{kind}", self._validate),
                web.post("/clusters/{cluster}/mutate/{group}/{version}/{kind}", self._mutate),
                web.post("/clusters/{cluster}/convert/{group}/{kind}", self._convert),
            ]
        )
        runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=1.0)
        await runner.setup()
        handlers = runner.server
        assert handlers is not None  # set by setup()
        try:
            listener = await asyncio.get_running_loop().create_server(
                lambda: _Tracked(handlers(), self._open),
                self.options.listen_host,
                self.options.listen_port,
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

    async def close(self) -> None:
        """Stop listening; calls in flight get a second to finish, then every connection is dropped."""
        runner, self._runner = self._runner, None
        listener, self._listener = self._listener, None
        if listener is not None:
            listener.close()
        if runner is not None:
            await runner.cleanup()
        # What is left is waiting on a peer's TLS goodbye (or was accepted as we closed): drop it now.
        lingering = list(self._open.items())
        for transport, _gone in lingering:
            transport.abort()
        if lingering:
            await asyncio.wait([gone for _transport, gone in lingering], timeout=1.0)
        self._open.clear()
        self.port = None

    # --- clusters -------------------------------------------------------------------------

    async def engage(self, name: str, cluster: Cluster) -> None:
        """Open ``name``'s lane and keep its configurations current (when registering)."""
        self._lanes[name] = asyncio.Semaphore(self.options.max_concurrent_per_cluster)

        def forget() -> None:
            if self._clusters().get(name) in (None, cluster):
                self._lanes.pop(name, None)

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

    def _cluster_of(self, request: web.Request) -> tuple[str, asyncio.Semaphore | None]:
        name = _cluster_from_path(request.match_info["cluster"])
        lane = self._lanes.get(name) if name in self._clusters() else None
        return name, lane

    async def _read(self, request: web.Request) -> JSON | web.Response:
        if request.content_type != "application/json":
            return _refuse(
                415, f"content type {request.content_type or '(none)'!r} is not served; send application/json"
            )
        try:
            body = await request.read()
        except web.HTTPRequestEntityTooLarge:
            return _refuse(
                413,
                f"the body is larger than {self.options.max_body_bytes} bytes, the most a webhook accepts",
            )
        try:
            return decode(body)
        except ReviewError as error:
            return _refuse(400, str(error))

    async def _validate(self, request: web.Request) -> web.StreamResponse:
        return await self._admit(request, mutating=False)

    async def _mutate(self, request: web.Request) -> web.StreamResponse:
        return await self._admit(request, mutating=True)

    async def _admit(self, request: web.Request, *, mutating: bool) -> web.StreamResponse:
        name, lane = self._cluster_of(request)
        if lane is None:
            return _refuse(404, f"cluster {name or '(local)'!r} is not engaged with this manager")
        group = request.match_info["group"]
        api_version = (
            request.match_info["version"]
            if group == CORE_GROUP
            else f"{group}/{request.match_info['version']}"
        )
        kind = Kind(api_version, request.match_info["kind"])
        hook = (self.defaulters if mutating else self.validators).get(kind)
        if hook is None:
            what = "mutating" if mutating else "validating"
            return _refuse(404, f"no {what} webhook is registered for {kind}")
        data = await self._read(request)
        if isinstance(data, web.Response):
            return data
        try:
            review = parse_admission(name, data)
        except ReviewError as error:
            return _refuse(400, str(error))
        return web.json_response(await self._answer(hook, review, lane, mutating=mutating), dumps=encode)

    async def _answer(
        self, hook: AdmissionHook, review: AdmissionRequest, lane: asyncio.Semaphore, *, mutating: bool
    ) -> JSON:
        original = snapshot(review.object) if mutating else None
        what = "defaulter" if mutating else "validator"
        deadline = asyncio.timeout(self.options.handler_timeout)
        try:
            async with deadline, lane:
                result = await _in_context(review, self._call(hook, review, mutating=mutating))
        except Denied as denial:
            return admission_response(
                review, allowed=False, message=denial.message, code=denial.code, reason=denial.reason
            )
        except TimeoutError as error:
            if not deadline.expired():  # the handler's own timeout (a slow call it made): its error
                log.error("webhook %s for %s raised", what, review, exc_info=error)
                return self._failed(hook, review, f"the {what} failed: {type(error).__name__}")
            log.error("webhook %s for %s took over %.1fs", what, review, self.options.handler_timeout)
            return self._failed(
                hook, review, f"the {what} did not answer within {self.options.handler_timeout}s"
            )
        except Exception as error:
            log.error("webhook %s for %s raised", what, review, exc_info=error)
            return self._failed(hook, review, f"the {what} failed: {type(error).__name__}")
        return admission_response(review, allowed=True, original=original, defaulted=result)

    @staticmethod
    async def _call(hook: AdmissionHook, review: AdmissionRequest, *, mutating: bool) -> JSON | None:
        if mutating:
            assert hook.defaulter is not None
            returned: object = await hook.defaulter(review)
            if returned is not None and not isinstance(returned, dict):
                raise TypeError(f"the defaulter returned a {type(returned).__name__}, not the object")
            defaulted = returned if returned is not None else review.object
            metadata = defaulted.get("metadata") if defaulted is not None else None
            if metadata is not None and not isinstance(metadata, dict):
                # The API server would refuse the patch with an unmarshal error the operator never sees.
                raise TypeError(f"the defaulter's object has a {type(metadata).__name__} as its metadata")
            return defaulted
        assert hook.validator is not None
        validate: Callable[[AdmissionRequest], Awaitable[object]] = hook.validator  # typed None; may not be
        verdict = await validate(review)
        if verdict is not None:
            # A validator that returns False or {"allowed": False} would otherwise admit: fail closed.
            raise TypeError(
                f"the validator returned a {type(verdict).__name__}; "
                "it returns None to admit and raises Denied to refuse"
            )
        return None

    def _failed(self, hook: AdmissionHook, review: AdmissionRequest, message: str) -> JSON:
        if hook.on_error == "error":
            raise web.HTTPInternalServerError(text=f"{review}: {message}\n")
        return admission_response(review, allowed=False, message=f"{review}: {message}", code=500)

    async def _convert(self, request: web.Request) -> web.StreamResponse:
        name, lane = self._cluster_of(request)
        if lane is None:
            return _refuse(404, f"cluster {name or '(local)'!r} is not engaged with this manager")
        group = request.match_info["group"]
        conversion = self.conversions.get(("" if group == CORE_GROUP else group, request.match_info["kind"]))
        if conversion is None:
            return _refuse(
                404, f"no conversion webhook is registered for {request.match_info['kind']}.{group}"
            )
        data = await self._read(request)
        if isinstance(data, web.Response):
            return data
        try:
            review = parse_conversion(name, data)
        except ReviewError as error:
            return _refuse(400, str(error))
        try:
            async with asyncio.timeout(self.options.handler_timeout), lane:
                converted = [
                    await conversion.convert(obj, review.desired_api_version) for obj in review.objects
                ]
        except ConversionFailed as error:
            if error.__cause__ is not None and not isinstance(error.__cause__, ConversionFailed):
                # A function that raised: its traceback in the log, only its type in the answer.
                log.error("cluster %r: %s", name, error, exc_info=error.__cause__)
            else:
                log.warning("cluster %r: %s", name, error)  # a refusal: its message is for the client
            return web.json_response(conversion_response(review.uid, None, str(error)), dumps=encode)
        except TimeoutError:
            message = (
                f"converting {len(review.objects)} {conversion.kind}.{conversion.group} "
                f"({_names(review.objects)}) to {review.desired_api_version} "
                f"took over {self.options.handler_timeout}s"
            )
            log.error("cluster %r: %s", name, message)
            return web.json_response(conversion_response(review.uid, None, message), dumps=encode)
        return web.json_response(conversion_response(review.uid, converted), dumps=encode)


def _names(objects: list[JSON], shown: int = 3) -> str:
    """``ns/name`` of the first few objects of a conversion, for its log line."""
    names = []
    for obj in objects[:shown]:
        metadata = obj.get("metadata")
        metadata = metadata if isinstance(metadata, dict) else {}
        namespace, name = metadata.get("namespace"), metadata.get("name", "?")
        names.append(f"{namespace}/{name}" if namespace else str(name))
    more = f" and {len(objects) - shown} more" if len(objects) > shown else ""
    return ", ".join(names) + more


async def _in_context(review: AdmissionRequest, call: Awaitable[JSON | None]) -> JSON | None:
    """Run ``call`` as if reconciling ``review``'s object: ``mgr.client`` addresses its cluster."""
    token = enter_reconcile("webhook", Request(review.cluster, review.namespace, review.name))
    try:
        return await call
    finally:
        leave_reconcile(token)
