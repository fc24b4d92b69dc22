"""One cluster's health: a single record, fed by its probe, read by everyone.

``statuses()``, ``/readyz``, ``/healthz``, the ``mcruntime_cluster_healthy``
metric and the fail-fast circuit all read the same :class:`HealthRecord`, so
they cannot disagree. Its verdict comes from the cluster's health probe, a
``GET /version`` on a fixed cadence with its own timeout:

- an answer of 200 makes the cluster healthy;
- 401 or 403 makes it unhealthy with "credentials rejected" (the endpoint is
  open to every authenticated user, so a refusal means the credential is bad);
- no answer (timeout, refused connection, TLS failure) makes it unhealthy and
  *unreachable*: the circuit opens, requests to the cluster fail at once with
  :class:`Unreachable` instead of holding a worker for a request timeout, and
  requests already waiting on the server are interrupted. The next probe that
  gets an answer closes the circuit and wakes every loop waiting out the outage.

Routine probes share a budget per process (``ClusterOptions.health_probe_budget``
probes per second): a fleet larger than ``budget * interval`` is probed less
often per cluster, so idle CPU stays flat as the fleet grows, instead of every
cluster costing one request per interval. Evidence of trouble is never paced:
a failed request probes at once, and a failing cluster is re-probed on its
backoff.

Requests and watches feed the record too, but only as evidence: a response is
contact, a failure is noted and makes the probe run at once, and a 401 that
survives re-authentication marks the credentials rejected. Only the probe
declares a cluster healthy, because a watch opened before a token was revoked
keeps streaming after it.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import time
import weakref
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from .._base.backoff import Backoff
from .permissions import Denials

log = logging.getLogger("mcruntime.health")


class HealthState(enum.Enum):
    """What the probe last concluded about a cluster."""

    UNKNOWN = "unknown"
    """Not probed yet."""
    HEALTHY = "healthy"
    UNHEALTHY = "unhealthy"


@dataclass(frozen=True)
class ClusterHealth:
    """A snapshot of one cluster's health record (wall-clock times).

    ``state`` and ``reason`` are the probe's verdict; ``unreachable`` says
    whether requests are failing fast because the server does not answer.
    ``last_contact`` is the last response of any kind, ``last_error`` the last
    failure any request, watch or probe saw. ``waiting`` says what a request
    is waiting for before it can be sent (an exec plugin still running, with
    how long so far), so a cluster whose first probe cannot start yet is
    seen waiting rather than silent. ``credential_error`` says why the last
    attempt to get the credential failed (an exec plugin missing, failing or
    too slow; a token file that cannot be used), ``None`` once one was got:
    providers whose sources name the plugin report it there too.
    """

    state: HealthState
    reason: str | None
    since: float
    unreachable: bool
    last_contact: float | None
    last_error: str | None
    last_error_at: float | None
    missing_permissions: tuple[str, ...] = ()
    """Requests the server refused with 403 (verb, kind, namespace) until the same request succeeds."""
    waiting: str | None = None
    credential_error: str | None = None

    @property
    def healthy(self) -> bool:
        """The last probe got a good answer."""
        return self.state is HealthState.HEALTHY


class ProbePacer:
    """Spreads the routine probes of every cluster in one event loop over a budget.

    Each probe loop that joins makes the fleet one larger; a healthy cluster's
    next probe then waits ``max(interval, members / budget)``. With the
    defaults (5 s, 50 probes/s) fleets of up to 250 clusters keep the 5 s
    cadence and 1,000 clusters are probed every 20 s.
    """

    def __init__(self) -> None:
        self.members = 0

    @contextmanager
    def member(self) -> Iterator[None]:
        self.members += 1
        try:
            yield
        finally:
            self.members -= 1

    def interval(self, interval: float, budget: float | None) -> float:
        """The time between one cluster's routine probes in a fleet of this size."""
        if not budget:
            return interval
        return max(interval, self.members / budget)


_pacers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, ProbePacer] = weakref.WeakKeyDictionary()


def probe_pacer() -> ProbePacer:
    """The running event loop's pacer: one budget for every cluster the process has."""
    loop = asyncio.get_running_loop()
    pacer = _pacers.get(loop)
    if pacer is None:
        pacer = _pacers[loop] = ProbePacer()
    return pacer


class HealthRecord:
    """The live record behind :class:`ClusterHealth`; one per cluster, owned by its transport."""

    def __init__(self, cluster: str) -> None:
        self.cluster = cluster
        self.state: HealthState = HealthState.UNKNOWN
        self.reason: str | None = "not probed yet"
        self.since: float = time.time()
        self.last_contact: float | None = None
        self.last_error: str | None = None
        self.last_error_at: float | None = None
        self._unreachable = False
        self._recovered: asyncio.Event | None = None
        self._suspect: asyncio.Event | None = None
        self._waits: dict[int, tuple[str, float]] = {}
        self.credential_error: str | None = None
        self.open_listeners: list[Callable[[str], None]] = []
        self.denials: Denials = Denials(cluster)

    def snapshot(self) -> ClusterHealth:
        return ClusterHealth(
            self.state,
            self.reason,
            self.since,
            self._unreachable,
            self.last_contact,
            self.last_error,
            self.last_error_at,
            self.denials.describe(),
            self._waiting(),
            self.credential_error,
        )

    @contextmanager
    def waiting(self, what: str) -> Iterator[None]:
        """Record that requests wait for ``what`` (an exec plugin's run, say) while the block runs."""
        key = object()  # kept alive by this frame, so its id is not reused while the block runs
        self._waits[id(key)] = (what, time.monotonic())
        try:
            yield
        finally:
            del self._waits[id(key)]

    def _waiting(self) -> str | None:
        if not self._waits:
            return None
        what, started = min(self._waits.values(), key=lambda wait: wait[1])
        return f"waiting for {what} for {time.monotonic() - started:.0f} s"

    # --- evidence from requests and watches ----------------------------------------------

    def contact(self) -> None:
        """The server answered something."""
        self.last_contact = time.time()

    def failure(self, message: str) -> None:
        """A request or watch failed without an answer; the probe should look now."""
        self.last_error = message
        self.last_error_at = time.time()
        self.suspect()

    def credentials_rejected(self, message: str) -> None:
        """A request was refused with 401 even after fetching a fresh credential."""
        self.last_error = message
        self.last_error_at = time.time()
        self._set(HealthState.UNHEALTHY, message)

    def suspect(self) -> None:
        """Ask the probe to run now rather than at its next tick."""
        if self._suspect is not None:
            self._suspect.set()

    # --- the probe's verdict ---------------------------------------------------------------

    @property
    def unreachable(self) -> bool:
        """The circuit is open: requests fail at once until a probe gets an answer."""
        return self._unreachable

    def healthy(self) -> None:
        self._set(HealthState.HEALTHY, None)
        if self._unreachable:
            self._unreachable = False
            if self._recovered is not None:
                self._recovered.set()
                self._recovered = None

    def unhealthy(self, reason: str, *, unreachable: bool) -> None:
        self.last_error = reason
        self.last_error_at = time.time()
        self._set(HealthState.UNHEALTHY, reason)
        if unreachable and not self._unreachable:
            self._unreachable = True
            for listener in list(self.open_listeners):
                try:
                    listener(reason)
                except Exception:
                    log.exception("cluster %r: a circuit listener failed", self.cluster)
        elif not unreachable and self._unreachable:
            # An answer, although a bad one: the server is there, so stop failing fast.
            self._unreachable = False
            if self._recovered is not None:
                self._recovered.set()
                self._recovered = None

    def recovery(self) -> asyncio.Event | None:
        """An event set when the open circuit closes; ``None`` while it is closed.

        A loop waiting out an outage passes it to :meth:`Backoff.sleep` so it
        resumes as soon as the server answers again.
        """
        if not self._unreachable:
            return None
        if self._recovered is None:
            self._recovered = asyncio.Event()
        return self._recovered

    def _set(self, state: HealthState, reason: str | None) -> None:
        if state is not self.state:
            level = logging.INFO if state is not HealthState.UNHEALTHY else logging.WARNING
            log.log(
                level,
                "cluster %r is %s%s",
                self.cluster,
                state.value,
                f": {reason}" if reason else "",
            )
            self.state = state
            self.since = time.time()
        self.reason = reason

    # --- the probe loop ----------------------------------------------------------------------

    async def probe_forever(
        self,
        probe: Callable[[float], Awaitable[tuple[str, bool] | None]],
        *,
        interval: float,
        timeout: float,
        backoff: Backoff,
        budget: float | None = None,
    ) -> None:
        """Run ``probe(timeout)`` every ``interval`` seconds, start to start, forever.

        ``probe`` returns ``None`` for a good answer, or why not and whether
        the server gave no answer at all (see :meth:`Transport.probe`). After a failure the next probe comes
        sooner (``backoff``, capped at ``interval``) so recovery shows quickly;
        a request that fails makes the probe run at once. With ``timeout <=
        interval`` a hung server is unhealthy within ``interval + timeout``.
        ``budget`` caps the routine probes per second of every cluster in this
        event loop together (see :class:`ProbePacer`).
        """
        with probe_pacer().member():
            await self._probe_loop(probe, interval, timeout, backoff, budget)

    async def _probe_loop(
        self,
        probe: Callable[[float], Awaitable[tuple[str, bool] | None]],
        interval: float,
        timeout: float,
        backoff: Backoff,
        budget: float | None,
    ) -> None:
        pacer = probe_pacer()
        self._suspect = asyncio.Event()
        loop = asyncio.get_running_loop()
        failures = 0
        while True:
            started = loop.time()
            self._suspect.clear()
            try:
                verdict = await probe(timeout)
            except Exception as error:  # never a probe loop that crashes and leaves the cluster unexplained
                log.error("cluster %r: the health probe raised %s", self.cluster, type(error).__name__)
                verdict = (f"the health probe failed on our side ({type(error).__name__})", False)
            if verdict is None:
                self.healthy()
                failures = 0
                wait = pacer.interval(interval, budget)
            else:
                reason, unreachable = verdict
                self.unhealthy(reason, unreachable=unreachable)
                failures += 1
                wait = min(interval, backoff.delay(failures - 1))
            remaining = started + wait - loop.time()
            if remaining <= 0:
                await asyncio.sleep(0)  # never a loop that does not yield, whatever the probe does
            else:
                try:
                    async with asyncio.timeout(remaining):
                        await self._suspect.wait()
                except TimeoutError:
                    pass
                else:
                    # Evidence of trouble: look now, but never more than once a second.
                    await asyncio.sleep(max(0.0, started + 1.0 - loop.time()))
