"""Connection pools shared by every cluster that reaches the same API server the same way.

A fleet often holds many clusters per API server: a token user per tenant,
per team, per namespace. Each with a pool of its own pays a TLS handshake for
every connection it opens and keeps its own idle connections, so 1,000
clusters on 10 servers cost thousands of handshakes to engage and thousands
of file descriptors at rest. client-go shares one transport per TLS
configuration and sends each client's credential per request; this does the
same: clusters whose endpoint (server, CA, proxy, TLS server name) is the
same and whose identity travels in a header (a bearer token, from a file or a
plugin, or none) share one session (``session.py``) and its connections.

Where identity is in the TLS handshake, a client certificate shares only
with clusters presenting the very same certificate, so pooled connections
never authenticate one cluster as another. Sharing never couples failures either: each transport
keeps its own health record and interrupts only its own requests and watches,
and a cluster that stops closes only its own streams; the session closes
with its last user.
"""

from __future__ import annotations

import asyncio
import contextlib
import weakref
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, TypeVar, cast

if TYPE_CHECKING:
    from .session import ServerSession


REQUESTS_IN_FLIGHT = 64
"""Requests (watches aside) one shared session sends at once by default; the rest queue
(``ClusterOptions.server_requests_in_flight``)."""


class Turns:
    """The requests one shared session has in flight, who waits next, and when its server last answered.

    At most ``limit`` requests go out at once; the rest wait, and a freed
    place goes to the clusters waiting *in turn*, one request of each, so a
    cluster with a thousand requests queued delays another cluster of the
    same server by at most one request per waiting cluster, not by its whole
    queue. ``answered_at`` (event loop time) tells a request that has waited
    long for its turn whether the queue is moving: a server that answers
    others is busy, not hung, which is what a health probe must not confuse.
    """

    def __init__(self, limit: int = REQUESTS_IN_FLIGHT) -> None:
        if limit < 1:
            raise ValueError(f"server_requests_in_flight must be at least 1, got {limit!r}")
        self.limit = limit
        self.in_flight = 0
        self.answered_at = float("-inf")
        # Waiting requests by cluster; the dict's order is the round: the next place goes
        # to the first cluster, which then moves to the back if it has more waiting.
        self._waiting: dict[str, deque[asyncio.Future[None]]] = {}

    @property
    def free(self) -> bool:
        """Whether a request may go out at once (a free place and nobody waiting for one)."""
        return self.in_flight < self.limit and not self._waiting

    def waiting(self, cluster: str | None = None) -> int:
        """Requests waiting for a place (of ``cluster``, or of all)."""
        if cluster is not None:
            return len(self._waiting.get(cluster, ()))
        return sum(len(queue) for queue in self._waiting.values())

    def take(self) -> None:
        """Take a free place at once (check :attr:`free` first); give it back with :meth:`release`."""
        assert self.free
        self.in_flight += 1

    async def acquire(self, cluster: str) -> None:
        """Wait for a place in ``cluster``'s turn; give it back with :meth:`release`."""
        if self.free:
            self.in_flight += 1
            return
        granted: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.setdefault(cluster, deque()).append(granted)
        try:
            await granted
        except BaseException:
            if granted.done() and not granted.cancelled():
                self.release()  # the place came as we gave up: hand it on
            else:
                queue = self._waiting.get(cluster)
                if queue is not None and granted in queue:
                    queue.remove(granted)
                    if not queue:
                        del self._waiting[cluster]
            raise

    def release(self) -> None:
        """Give a place back: to the next cluster in the round, or free."""
        while self._waiting:
            cluster = next(iter(self._waiting))
            queue = self._waiting.pop(cluster)
            granted = queue.popleft()
            if queue:
                self._waiting[cluster] = queue  # to the back of the round
            if not granted.done():
                granted.set_result(None)  # the place passes on: in_flight unchanged
                return
        self.in_flight -= 1

    def answered(self) -> None:
        self.answered_at = asyncio.get_running_loop().time()

    def moving(self, within: float) -> bool:
        """Whether the server answered a request of this session in the last ``within`` seconds."""
        return asyncio.get_running_loop().time() - self.answered_at < within

    async def wait_turn(self, cluster: str, timeout: float, patient: bool) -> float | None:
        """Wait for ``cluster``'s place among the requests in flight; the seconds of ``timeout`` left.

        ``None`` when a place was free at once (no wait, no task). The wait
        counts against the request's own ``timeout``, so a queue behind a hung
        server fails like the server itself would. A ``patient`` request (the
        health probe) waits on while the queue moves, and its timeout starts
        with its turn: a server that answers others is busy, not unreachable.

        Raises:
            NoTurn: no place came free in time (and, if patient, the queue stood still).
        """
        if self.free:
            self.take()
            return None
        loop = asyncio.get_running_loop()
        began = loop.time()
        acquiring = asyncio.ensure_future(self.acquire(cluster))
        try:
            while True:
                await asyncio.wait({acquiring}, timeout=timeout)
                if acquiring.done():
                    break
                if not (patient and self.moving(timeout)):
                    raise NoTurn(
                        f"no turn to send in {loop.time() - began:.3g}s "
                        f"({self.limit} requests to the server in flight and no answer)"
                    )
        except BaseException:
            if acquiring.done() and not acquiring.cancelled() and acquiring.exception() is None:
                self.release()  # it came through as we gave up: hand it back
            else:
                acquiring.cancel()  # a place granted meanwhile is handed on by acquire()
            raise
        return timeout if patient else max(0.001, timeout - (loop.time() - began))


class NoTurn(Exception):
    """A request found no place among the shared session's requests in flight in time."""


@dataclass
class _Shared:
    session: ServerSession
    users: int
    turns: Turns


@dataclass
class _Opening:
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    waiting: int = 0


class SessionPool:
    """Reference-counted sessions by sharing key, on one event loop."""

    def __init__(self) -> None:
        self._shared: dict[str, _Shared] = {}
        self._opening: dict[str, _Opening] = {}

    @contextlib.asynccontextmanager
    async def opening(self, key: str) -> AsyncIterator[None]:
        """Hold ``key``'s turn to look for its session and, if there is none, to make it.

        Transports that open in the same moment (a fleet's cold start) would
        otherwise all find no session and each build a TLS context of their
        own, loading the same certificate once per cluster (10,000 times for
        10,000 names over three servers), only for all but one to be thrown
        away. One at a time, the first builds and the others find its session.
        """
        entry = self._opening.get(key)
        if entry is None:
            entry = self._opening[key] = _Opening()
        entry.waiting += 1
        try:
            async with entry.lock:
                yield
        finally:
            entry.waiting -= 1
            if entry.waiting == 0 and self._opening.get(key) is entry:
                del self._opening[key]

    def existing(self, key: str) -> ServerSession | None:
        """The open session of ``key``, leased to the caller (release it), or ``None``."""
        entry = self._shared.get(key)
        if entry is None or entry.session.closed:
            return None
        entry.users += 1
        return entry.session

    def lease(
        self, key: str, make: Callable[[], ServerSession], limit: int = REQUESTS_IN_FLIGHT
    ) -> ServerSession:
        """The session of ``key``, made with ``make()`` if there is none; release it when done.

        ``limit`` bounds the requests in flight of a new session; the cluster
        that opens the session decides it for every cluster that shares it.
        """
        found = self.existing(key)
        if found is not None:
            return found
        entry = self._shared[key] = _Shared(make(), 1, Turns(limit))
        return entry.session

    def turns(self, key: str) -> Turns | None:
        """The requests in flight of ``key``'s session (see the module's docstring)."""
        entry = self._shared.get(key)
        return entry.turns if entry is not None else None

    async def release(self, key: str, session: ServerSession) -> None:
        """Give a lease back; the last one closes the session."""
        entry = self._shared.get(key)
        if entry is None or entry.session is not session:
            await close_session(session)  # replaced meanwhile (it had closed): nobody else holds it
            return
        entry.users -= 1
        if entry.users <= 0:
            del self._shared[key]
            await close_session(session)

    def __len__(self) -> int:
        return len(self._shared)

    def users(self, key: str) -> int:
        """How many transports hold ``key``'s session (for tests and metrics)."""
        entry = self._shared.get(key)
        return entry.users if entry is not None else 0


_pools: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, SessionPool] = weakref.WeakKeyDictionary()


def session_pool() -> SessionPool:
    """The running event loop's pool: sessions and their connections belong to one loop."""
    loop = asyncio.get_running_loop()
    pool = _pools.get(loop)
    if pool is None:
        pool = _pools[loop] = SessionPool()
    return pool


class _Companion(Protocol):
    def close(self) -> None: ...


_C = TypeVar("_C", bound=_Companion)
_companions: weakref.WeakKeyDictionary[ServerSession, _Companion] = weakref.WeakKeyDictionary()


def companion(session: ServerSession, make: Callable[[], _C]) -> _C:
    """What lives and dies with ``session`` (its HTTP/2 watch connections), made on first use."""
    found = _companions.get(session)
    if found is None:
        found = _companions[session] = make()
    return cast("_C", found)  # one kind of companion per session


async def close_session(session: ServerSession) -> None:
    """Close ``session`` and what lives with it."""
    found = _companions.pop(session, None)
    if found is not None:
        found.close()
    await session.close()
