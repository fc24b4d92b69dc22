"""The manager's HTTP endpoints: health and readiness probes, and Prometheus metrics.

``/healthz`` says the process is alive (the event loop answers, plus any check
the user adds); ``/readyz`` says the caches are ready: the local cluster's and
enough of the engaged clusters' (all by default). ``?verbose`` lists every
check as the API server does (``[+]name ok`` / ``[-]name failed: reason``), so
an unreachable member shows up by name. ``/metrics`` serves the manager's own
registry.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from .connections import IDLE_TIMEOUT, MAX_CONNECTIONS, Connections

if TYPE_CHECKING:
    # Imported where used: aiohttp's server side costs ~25 ms of CPU at start-up, and
    # a manager without a probe or metrics address never serves.
    from aiohttp import web
    from aiohttp.typedefs import Handler

log = logging.getLogger("mcruntime.serving")
http_log = logging.getLogger("mcruntime.serving.http")
"""The logger aiohttp's request handlers get, in place of ``aiohttp.server``."""

CheckResult = str | None
"""``None`` when the check passes, otherwise why it fails."""
Check = Callable[[], CheckResult | Awaitable[CheckResult]]
"""A health or readiness check: returns ``None`` when it passes, or why it fails (sync or async)."""
CheckLine = tuple[str, CheckResult, bool]
"""A line of verbose output: name, failure reason (or ``None``), and whether it counts."""


ADDRESS_FORMS = "host:port, :port or [IPv6]:port, with a port of 0-65535"
"""What :func:`parse_address` accepts, for error messages."""
EVERY_INTERFACE = "0.0.0.0"  # noqa: S104 -- probes and metrics must be reachable from outside the pod
"""The host ``:port`` binds: every IPv4 interface."""


def parse_address(address: str) -> tuple[str, int]:
    """The host (brackets removed; ``""`` for every interface) and port of a bind address.

    One parser for every endpoint the settings name (/metrics, the probes, the
    webhook server), so a value that passes validation is one that binds, and
    two spellings of one socket are recognised as one. An IPv6 host must be in
    brackets: ``::1:8080`` is also a whole IPv6 address, so reading its last
    group as the port would be a guess. Raises :class:`ValueError`.
    """
    host, colon, port = address.rpartition(":")
    if not colon or not (port.isascii() and port.isdigit()) or int(port) > 65535:
        raise ValueError(f"expected {ADDRESS_FORMS}")
    if host.startswith("[") and host.endswith("]"):
        try:
            return str(ipaddress.IPv6Address(host[1:-1])), int(port)
        except ValueError:
            raise ValueError(f"{host} is not an IPv6 address in brackets") from None
    if ":" in host:
        raise ValueError(f"an IPv6 host goes in brackets, as in [::1]:{port}")
    if not host.isprintable() or any(char.isspace() or char in "[]/" for char in host):
        raise ValueError(f"{host!r} is not a host name or IP address")
    return host, int(port)


def bind_key(address: str) -> tuple[str, int]:
    """The socket an address binds, spelled one way: ``:8080`` and ``0.0.0.0:8080`` are one key."""
    host, port = parse_address(address)
    if not host:
        return EVERY_INTERFACE, port
    try:
        return str(ipaddress.ip_address(host)), port
    except ValueError:
        return host.lower(), port  # a name: DNS names are case-insensitive


def _quiet_bad_request(record: logging.LogRecord) -> bool:
    """A malformed request is the client's fault: one DEBUG line, without the traceback.

    aiohttp logs each at ERROR with a traceback (~600 bytes, the client's bytes
    quoted), so whoever reaches the port chose how much went into the log. The
    client gets its 4xx either way; aiohttp's other records keep their level.
    """
    from aiohttp.http_exceptions import HttpProcessingError  # loaded: only aiohttp logs here

    error = record.exc_info[1] if record.exc_info else None
    if not isinstance(error, HttpProcessingError):
        return True
    remote = record.args[0] if isinstance(record.args, tuple) and record.args else "?"
    reason = str(error.message).splitlines()[0] if error.message else ""
    record.msg = "answered a malformed request from %s with %s: %s %.100r"
    record.args = (remote, error.code, type(error).__name__, reason)
    record.levelno, record.levelname = logging.DEBUG, logging.getLevelName(logging.DEBUG)
    record.exc_info = record.exc_text = None
    # The logger let it through as an ERROR: as a DEBUG line it goes out only where DEBUG is on.
    return http_log.isEnabledFor(logging.DEBUG)


http_log.addFilter(_quiet_bad_request)


@dataclass
class _NamedCheck:
    name: str
    check: Callable[[], Awaitable[list[CheckLine]]]


async def _run(check: Check) -> CheckResult:
    try:
        result = check()
        if isinstance(result, Awaitable):
            return await result
        return result
    except Exception as error:  # a broken check fails, it does not crash the endpoint
        return f"check raised {type(error).__name__}: {error}"


class Checks:
    """A named list of checks; a check may expand into several lines (one per cluster)."""

    def __init__(self) -> None:
        self._checks: list[_NamedCheck] = []

    def add(self, name: str, check: Check) -> None:
        """A single check: ``check()`` returns ``None`` when healthy, else the reason."""

        async def one() -> list[CheckLine]:
            return [(name, await _run(check), True)]

        self._checks.append(_NamedCheck(name, one))

    def add_group(self, name: str, checks: Callable[[], Awaitable[list[CheckLine]]]) -> None:
        """A check that reports several named lines, e.g. one per engaged cluster.

        Lines whose third element is ``False`` are shown but do not decide the
        outcome (a summary line does).
        """
        self._checks.append(_NamedCheck(name, checks))

    async def evaluate(self) -> list[CheckLine]:
        lines: list[CheckLine] = []
        for named in self._checks:
            try:
                lines.extend(await named.check())
            except Exception as error:
                lines.append((named.name, f"check raised {type(error).__name__}: {error}", True))
        return lines


def _respond(lines: list[CheckLine], verbose: bool, what: str) -> web.Response:
    from aiohttp import web

    failed = [line for line in lines if line[1] is not None and line[2]]
    status = 500 if failed else 200
    if not verbose:
        return web.Response(status=status, text="ok" if not failed else f"{what} check failed")
    body = [f"[+]{name} ok" if reason is None else f"[-]{name} failed: {reason}" for name, reason, _ in lines]
    body.append(f"{what} check {'failed' if failed else 'passed'}")
    return web.Response(status=status, text="\n".join(body) + "\n")


class Endpoints:
    """One aiohttp server per address; probes and metrics may share one.

    Each server closes a connection that sends no request for ``idle_timeout``
    seconds and holds at most ``max_connections`` (see :mod:`.connections`).
    """

    def __init__(
        self,
        healthz: Checks,
        readyz: Checks,
        registry: CollectorRegistry,
        *,
        idle_timeout: float = IDLE_TIMEOUT,
        max_connections: int = MAX_CONNECTIONS,
    ) -> None:
        self.healthz = healthz
        self.readyz = readyz
        self._registry = registry
        self._idle_timeout = idle_timeout
        self._max_connections = max_connections
        self._servers: list[tuple[web.AppRunner, asyncio.Server, Connections]] = []
        self.addresses: dict[str, tuple[str, int]] = {}

    async def _health(self, request: web.Request) -> web.Response:
        return _respond(await self.healthz.evaluate(), "verbose" in request.query, "healthz")

    async def _ready(self, request: web.Request) -> web.Response:
        return _respond(await self.readyz.evaluate(), "verbose" in request.query, "readyz")

    async def _metrics(self, _request: web.Request) -> web.Response:
        from aiohttp import web

        payload = generate_latest(self._registry)
        return web.Response(body=payload, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def start(self, *, probes: str | None, metrics: str | None) -> None:
        """Listen on ``host:port`` addresses (port 0 picks a free one; see ``addresses``).

        Two addresses that name one socket (``:8080`` and ``0.0.0.0:8080``) get
        one server: two would collide on the port. Port 0 names no socket yet:
        each such address gets a port of its own, as asked.
        """
        if not probes and not metrics:
            return  # nothing to serve: aiohttp is not even imported
        from aiohttp import web

        servers: list[tuple[tuple[str, int], str, list[web.RouteDef]]] = []
        wanted = [(probes, [web.get("/healthz", self._health), web.get("/readyz", self._ready)])]
        wanted.append((metrics, [web.get("/metrics", self._metrics)]))
        for address, address_routes in wanted:
            if address:
                try:
                    key = bind_key(address)
                except ValueError as error:  # a Manager built by hand; settings validate theirs
                    paths = ", ".join(route.path for route in address_routes)
                    raise ValueError(f"cannot serve {paths} on {address!r}: {error}") from None
                shared = next((server for server in servers if key[1] and server[0] == key), None)
                if shared is not None:
                    shared[2].extend(address_routes)
                else:
                    servers.append((key, address, list(address_routes)))
        for (host, port), address, address_routes in servers:
            await self._serve(host, port, address, address_routes)

    async def _serve(self, host: str, port: int, address: str, routes: list[web.RouteDef]) -> None:
        from aiohttp import web

        connections = Connections(address, limit=self._max_connections, idle_timeout=self._idle_timeout)

        @web.middleware  # on a function: a bound method takes no attribute
        async def track(request: web.Request, handler: Handler) -> web.StreamResponse:
            return await connections.track(request, handler)

        app = web.Application(middlewares=[track])
        app.add_routes(routes)
        runner = web.AppRunner(app, access_log=None, keepalive_timeout=self._idle_timeout, logger=http_log)
        await runner.setup()
        handlers = runner.server
        assert handlers is not None  # set by setup()
        try:
            # Not a TCPSite: the protocol factory is wrapped, to count and bound the connections.
            listener = await asyncio.get_running_loop().create_server(
                lambda: connections.accept(handlers), host, port, backlog=128
            )
        except OSError as error:
            await runner.cleanup()
            paths = ", ".join(route.path for route in routes)
            raise OSError(f"cannot serve {paths} on {address}: {error}") from error
        self._servers.append((runner, listener, connections))
        bound = listener.sockets[0].getsockname() if listener.sockets else (host, port)
        connections.address = f"[{bound[0]}]:{bound[1]}" if ":" in bound[0] else f"{bound[0]}:{bound[1]}"
        for route in routes:
            self.addresses[route.path] = (bound[0], bound[1])
        log.info("serving %s on %s:%s", ", ".join(r.path for r in routes), bound[0], bound[1])

    async def stop(self) -> None:
        for runner, listener, connections in self._servers:
            listener.close()
            await runner.cleanup()
            connections.close()
        self._servers.clear()

    def url(self, path: str) -> str:
        host, port = self.addresses[path]
        return f"http://[{host}]:{port}{path}" if ":" in host else f"http://{host}:{port}{path}"
