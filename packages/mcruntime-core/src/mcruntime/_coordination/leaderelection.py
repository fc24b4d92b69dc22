"""Leader election with a coordination.k8s.io/v1 Lease on the local cluster.

One replica holds the Lease and reconciles; the others keep their providers and
caches warm and wait, so a takeover starts from full caches. Expiry is judged
by *local* observation (how long since this replica last saw the Lease change),
never by comparing the holder's timestamps with our clock, so clock skew
between replicas cannot make two of them lead. A leader that cannot renew
within ``renew_deadline`` steps down before its Lease can expire elsewhere; a
graceful shutdown releases the Lease so a standby takes over at once.

A leader renews from a thread of its own, with its own connection to the
cluster (see heartbeat.py), as sharding does: a busy event loop (a cold start
of many clusters, a reconciler computing too long) must not cost a working
leader its Lease. The thread renews only while the event loop keeps turning,
and the loop steps down when no renewal landed within the deadline.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .._base.backoff import DEFAULT_BACKOFF, Backoff
from .._base.errors import AlreadyExists, APIError, Conflict, Forbidden, NotFound, Unreachable
from .._base.names import name_problem
from .heartbeat import Connect, Heartbeat, own_connection
from .lease import LEASE, default_identity, lease_object, released, spec_of, take, transitions_of

if TYPE_CHECKING:
    from .._client.client import Client
    from .._fleet.cluster import Cluster

__all__ = ["LEASE", "LeaderElectionConfig", "LeaderElector", "default_identity"]

log = logging.getLogger("mcruntime.leaderelection")


def lease_name_problem(part: str, value: object) -> str | None:
    """Why ``value`` cannot be a Lease's ``name`` (a DNS subdomain) or ``namespace`` (a DNS label).

    ``None`` if it can. The rule is the one ``mcruntime rbac`` checks its names with.
    """
    if not isinstance(value, str):
        return f"the Lease's {part} must be a string, not {type(value).__name__}"
    problem = name_problem(value, subdomain=part == "name")
    return None if problem is None else f"the Lease's {part} {problem}"


def _refused(error: BaseException) -> bool:
    """Whether the hub answered with a 4xx that the next attempt will get too.

    A conflict (409) is the race a campaign expects, a throttle (429) and a
    request timeout (408) pass; any other 4xx (422 Invalid, 400, 401...)
    repeats until someone changes the Lease's name, the credentials or the
    hub's admission rules.
    """
    return isinstance(error, APIError) and 400 <= error.status < 500 and error.status not in (408, 409, 429)


def _described(error: BaseException) -> str:
    """An error as a line: its text, or its type where it has none (a bare ``TimeoutError``)."""
    text = str(error)
    if isinstance(error, APIError) or not text:
        return text or type(error).__name__
    return f"{type(error).__name__}: {text}"


@dataclass(frozen=True)
class LeaderElectionConfig:
    """Where the Lease lives and how fast leadership moves (client-go's defaults)."""

    name: str
    namespace: str = "default"
    identity: str = field(default_factory=default_identity)
    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0

    def __post_init__(self) -> None:
        # The API server refuses such a Lease at every attempt (a 422, or a 500 for ".."), so a
        # replica built with one would campaign forever and never lead: refuse it here instead.
        for parameter, value in (("name", self.name), ("namespace", self.namespace)):
            problem = lease_name_problem(parameter, value)
            if problem is not None:
                raise ValueError(f"LeaderElectionConfig {parameter}={value!r}: {problem}")
        if not self.lease_duration > self.renew_deadline > self.retry_period > 0:
            raise ValueError(
                "leader election needs lease_duration > renew_deadline > retry_period > 0, got "
                f"{self.lease_duration} > {self.renew_deadline} > {self.retry_period}"
            )


class LeaderElector:
    """Campaigns for the Lease while running; ``leading`` is set while this replica leads.

    ``backoff`` paces retries after unexpected failures (a Lease kind the hub
    does not serve, a garbled answer): the campaign logs them and goes on, so a
    replica that could not campaign for a while leads again once the hub is
    sane. Tests inject a zero-delay backoff.
    """

    def __init__(self, config: LeaderElectionConfig, *, backoff: Backoff = DEFAULT_BACKOFF) -> None:
        self._cluster: Cluster | None = None
        self.config = config
        self.backoff = backoff
        self.leading: asyncio.Event = asyncio.Event()
        self._lost = asyncio.Event()
        self._observed: tuple[str, str] | None = None
        self._observed_at = 0.0
        self.transitions: int = 0
        self.last_reason: str | None = None
        self.failures: int = 0
        """Consecutive unexpected failures of the campaign (0 once an attempt got an answer)."""
        self.renewals: int = 0
        """Renewals of the Lease while leading (on the heartbeat's thread)."""
        self._renewed_at = 0.0  # time.monotonic() of the last renewal; written by the heartbeat's thread
        # Renewals that landed only after the leader should have stepped down (written by the
        # heartbeat's thread, before _renewed_at): the Lease may have changed hands meanwhile,
        # so such a renewal ends the term instead of extending it.
        self._lapses = 0
        self._lapses_handled = 0
        # How the heartbeat's thread reaches the cluster; None: a connection of its own from
        # the cluster's kubeconfig. Tests put a breakable client here.
        self._liveness: Connect | None = None
        # A request may take longer than a retry period on a busy server; half the renew
        # deadline still leaves a second attempt before the leader steps down.
        self._request_timeout = max(config.retry_period, config.renew_deadline / 2)
        # Why the campaign cannot run (the Lease's namespace is missing, the identity may
        # not use Leases there); None while the hub answers the campaign. Shown by /readyz.
        self._trouble: str | None = None
        self._trouble_key: str | None = None  # see _troubled
        # Another holder this replica read on the Lease while it led (it was deleted and
        # taken, or edited): the term is over at once. Written by the heartbeat's thread.
        self._taken_by: str | None = None

    @property
    def identity(self) -> str:
        return self.config.identity

    @property
    def observed_holder(self) -> str | None:
        """The holder this replica last read on the Lease (``""`` if free), ``None`` before its first read.

        What a standby knows about the leader; tests and status pages wait on it
        instead of sleeping until the standby has looked.
        """
        return self._observed[0] if self._observed is not None else None

    def refusal(self) -> str | None:
        """Why a reconcile must not write now, or ``None`` while this replica leads in good standing.

        Asked by the client before each write of a reconcile (see
        _reconcile/fence.py): stepping down is this loop's task, and on a
        loop that runs late a reconcile ready at the same moment goes first.
        """
        where = f"leader election {self.config.namespace}/{self.config.name}"
        if not self.leading.is_set():
            return f"{where}: this replica does not lead"
        if self._taken_by is not None:
            return f"{where}: the Lease is now held by {self._taken_by!r}"
        if self._lapses != self._lapses_handled:
            return f"{where}: a renewal landed after the renew deadline, so another replica may lead"
        quiet = time.monotonic() - self._renewed_at
        if quiet >= self._give_up_after:
            return f"{where}: the Lease was not renewed for {quiet:.1f}s, so another replica may lead soon"
        return None

    def problem(self) -> str | None:
        """Why this replica cannot campaign now, or ``None``; for ``/readyz``.

        A standby that waits for the leader is fine. One whose every attempt
        is refused (no such namespace, no right to use Leases there, a 4xx
        such as a 422 from an admission rule), or fails for longer than a
        Lease lasts (a 500 from a broken admission webhook, a hub that does not
        answer), will never lead, so it is named as not ready instead of
        passing in silence.
        """
        trouble = self._trouble
        if trouble is None:
            return None
        return f"leader election {self.config.namespace}/{self.config.name}: {trouble}"

    @property
    def _give_up_after(self) -> float:
        return self.config.renew_deadline - self.config.retry_period

    async def wait_elected(self) -> None:
        await self.leading.wait()

    async def wait_lost(self) -> None:
        """Wait until the current term ends (returns at once if not leading)."""
        if not self.leading.is_set():
            return
        await self._lost.wait()

    async def run(self, cluster: Cluster) -> None:
        """Campaign on ``cluster`` (the local one): acquire, renew, and on cancellation release.

        Never returns or raises until cancelled: every failure is logged and
        retried with the backoff, and a leader that fails steps down first.
        """
        self._cluster = cluster
        try:
            while True:
                try:
                    await self._acquire()
                    await self._lead(cluster)
                except Exception as error:  # the campaign must outlive any failure
                    self._failed(error)
                    self._step_down(f"the campaign failed: {self.last_reason}")
                    await self.backoff.sleep(self.failures)
        finally:
            if self.leading.is_set():
                await asyncio.shield(self._release())
                self._step_down("released on shutdown")

    def _failed(self, error: BaseException) -> None:
        self.failures += 1
        self.last_reason = f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
        log.warning(
            "leader election %s/%s: attempt failed (%d in a row): %s",
            self.config.namespace,
            self.config.name,
            self.failures,
            self.last_reason,
            exc_info=not isinstance(error, APIError | OSError | TimeoutError | Unreachable),
        )

    async def _acquire(self) -> None:
        passing_since: float | None = None  # when the passing failures in a row began
        while True:
            try:
                assert self._cluster is not None
                won, _holder = await self._try_acquire_or_renew(self._cluster.client)
            except NotFound as error:  # the create's: there is no such namespace
                self._troubled(f"its namespace does not exist ({error})")
                self.failures, passing_since = 0, None
            except Forbidden as error:
                self._troubled(f"forbidden: {error}")
                self.failures, passing_since = 0, None
            except (APIError, OSError, TimeoutError) as error:
                self.failures = 0
                if _refused(error):  # a 422 for the Lease, a 400, a 401: every retry gets it again
                    self._troubled(f"the hub refuses the Lease: {error}")
                    passing_since = None
                else:  # a 5xx, a throttle, no answer: passing, unless it outlasts a Lease
                    now = time.monotonic()
                    passing_since = now if passing_since is None else passing_since
                    if now - passing_since < self.config.lease_duration:
                        log.debug("leader election: %s", error)
                    else:
                        # A 500 from a broken admission webhook on Leases never passes, and a
                        # standby that silently never leads would look ready forever.
                        lasted = f"every attempt for over {self.config.lease_duration:g}s failed"
                        self._troubled(f"{lasted}; the last: {_described(error)}", key=lasted)
            except Exception as error:  # KindNotFound, a garbled Lease: keep campaigning
                self._failed(error)
                await self.backoff.sleep(self.failures)
                continue
            else:
                self.failures, passing_since = 0, None
                self._untroubled()
                if won:
                    self.leading.set()
                    self._lost = asyncio.Event()
                    log.info(
                        "%s became the leader (lease %s/%s)",
                        self.identity,
                        self.config.namespace,
                        self.config.name,
                    )
                    return
            await asyncio.sleep(self.config.retry_period)

    def _troubled(self, reason: str, *, key: str | None = None) -> None:
        """Record why the campaign is refused; logged when the reason changes, not every retry.

        ``key``: what counts as the same reason when its text varies from one
        attempt to the next (a lasting failure, whose last error changes).
        """
        same = key is not None and self._trouble_key == key
        self._trouble_key = key
        if reason != self._trouble and not same:
            log.warning(
                "leader election %s/%s: cannot campaign: %s; retrying every %gs",
                self.config.namespace,
                self.config.name,
                reason,
                self.config.retry_period,
            )
        self._trouble = reason

    def _untroubled(self) -> None:
        if self._trouble is not None:
            log.info("leader election %s/%s: campaigning again", self.config.namespace, self.config.name)
            self._trouble = None
            self._trouble_key = None

    async def _lead(self, cluster: Cluster) -> None:
        """Renew from the heartbeat's thread while leading; step down when renewals stop landing.

        This loop ticks the heartbeat (it renews only while the loop turns),
        restarts its thread if it died, and steps down once no renewal landed
        for ``renew_deadline - retry_period``, before the Lease can expire for
        the others.
        """
        self._renewed_at = time.monotonic()  # the acquisition just now was a renewal
        self._lapses_handled = self._lapses
        self._taken_by = None
        heartbeat = Heartbeat(
            f"leader election {self.config.namespace}/{self.config.name}",
            self._liveness or functools.partial(own_connection, cluster.config, self._request_timeout),
            self._beat,
            stall_limit=self.config.renew_deadline,
            idle=self.config.retry_period,
            logger=log,
            stalled="this replica steps down and another may lead",
        )
        give_up_after = self._give_up_after
        heartbeat.start()
        try:
            while True:
                await asyncio.sleep(self.config.retry_period / 2)
                heartbeat.tick()
                if (usurper := self._usurper()) is not None:
                    self._step_down(f"the Lease is now held by {usurper!r}")
                    return
                if self._lapses != self._lapses_handled:
                    self._step_down(
                        f"a renewal landed only after {give_up_after:g}s without one, too late to "
                        "count: the Lease may have changed hands meanwhile"
                    )
                    return
                if time.monotonic() - self._renewed_at >= give_up_after:
                    self._step_down(
                        f"could not renew the lease within {self.config.renew_deadline:.0f}s"
                        f"{f' ({self.last_reason})' if self.last_reason else ''}"
                    )
                    return
                if not heartbeat.running:
                    log.error("%s: the leader election heartbeat had stopped; restarting it", self.identity)
                    try:
                        heartbeat.start()
                    except RuntimeError as error:  # no thread to be had now: the next tick tries again
                        log.error("%s: could not restart the heartbeat: %s", self.identity, error)
        finally:
            await asyncio.shield(heartbeat.stop(self._request_timeout))

    async def _beat(self, client: Client) -> float:
        """One renewal, on the heartbeat's thread with its own client; the next is due a retry period on."""
        started = time.monotonic()
        other = ""
        try:
            async with asyncio.timeout(self._request_timeout):
                renewed, other = await self._try_acquire_or_renew(client)
        except (APIError, OSError, TimeoutError, Unreachable) as error:
            renewed = False
            self.last_reason = str(error) or type(error).__name__
        except Exception as error:  # a failed renewal, whatever the cause
            renewed = False
            self._failed(error)
        if not renewed and other:
            # Deleted and taken by another, or edited: never wait out the deadline while
            # someone else holds it (the refusal stops this replica's writes from now on).
            self._taken_by = other
        if renewed:
            self.failures = 0
            self.renewals += 1
            if time.monotonic() - self._renewed_at >= self._give_up_after:
                self._lapses += 1  # before _renewed_at: whoever sees the fresh renewal sees the lapse too
            self._renewed_at = started
        return self.config.retry_period

    def _usurper(self) -> str | None:
        """Another holder the heartbeat read on the Lease during this term (set from its thread)."""
        return self._taken_by

    def _step_down(self, reason: str) -> None:
        if self.leading.is_set():
            log.warning("%s lost leadership: %s", self.identity, reason)
            self.leading.clear()
            self._lost.set()

    def _expired(self, holder: str, renew_time: str) -> bool:
        observed = (holder, renew_time)
        now = time.monotonic()
        if observed != self._observed:
            self._observed = observed
            self._observed_at = now
        return now - self._observed_at > self.config.lease_duration

    async def _try_acquire_or_renew(self, client: Client) -> tuple[bool, str]:
        """Whether this replica holds the Lease now, and the other holder it read (``""`` if none)."""
        try:
            lease = await client.get(LEASE, self.config.name, namespace=self.config.namespace)
        except NotFound:
            fresh = lease_object(
                self.config.name, self.config.namespace, self.identity, self.config.lease_duration
            )
            try:
                await client.create(fresh)
            except AlreadyExists:
                return False, ""
            self.transitions = 0
            return True, ""
        if not isinstance(lease, dict) or not isinstance(lease.get("metadata"), dict):
            raise ValueError(f"the hub answered a Lease without metadata: {str(lease)[:200]!r}")
        spec = spec_of(lease)
        holder = str(spec.get("holderIdentity") or "")
        other = holder if holder != self.identity else ""
        if other and not self._expired(other, str(spec.get("renewTime", ""))):
            return False, other
        written = take(lease, self.identity, self.config.lease_duration)
        try:
            await client.update(written)  # resourceVersion in lease: optimistic concurrency
        except Conflict:
            return False, other
        self.transitions = transitions_of(spec_of(written))
        return True, other

    async def _release(self) -> None:
        assert self._cluster is not None
        client = self._cluster.client
        try:
            lease = await client.get(LEASE, self.config.name, namespace=self.config.namespace)
            if spec_of(lease).get("holderIdentity") != self.identity:
                return
            await client.update(released(lease))
            log.info("%s released the lease %s/%s", self.identity, self.config.namespace, self.config.name)
        except (APIError, Unreachable, OSError) as error:
            log.warning("%s could not release the lease: %s", self.identity, error)
        except Exception as error:  # shutdown goes on; the Lease expires by itself
            log.warning("%s could not release the lease: %r", self.identity, error)
