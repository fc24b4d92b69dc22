"""Leader election with a coordination.k8s.io/v1 Lease on the local cluster.

One replica holds the Lease and reconciles; the others keep their providers and
caches warm and wait, so a takeover starts from full caches. Expiry is judged
by *local* observation (how long since this replica last saw the Lease change),
never by comparing the holder's timestamps with our clock, so clock skew
between replicas cannot make two of them lead. A leader that cannot renew
within ``renew_deadline`` steps down before its Lease can expire elsewhere; a
graceful shutdown releases the Lease so a standby takes over at once.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import socket
import time
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ._errors import AlreadyExists, APIError, Conflict, NotFound, Unreachable
from ._kind import Kind

if TYPE_CHECKING:
    from ._cluster import Cluster

log = logging.getLogger("mcruntime.leaderelection")
LEASE = Kind("coordination.k8s.io/v1", "Lease")


def _micro_time(moment: datetime.datetime | None = None) -> str:
    value = moment or datetime.datetime.now(datetime.UTC)
    return value.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def default_identity() -> str:
    """Host name plus a random suffix: unique per process, readable in ``kubectl get lease``."""
    return f"{socket.gethostname()}_{uuid.uuid4().hex[:8]}"


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
        if not self.lease_duration > self.renew_deadline > self.retry_period > 0:
            raise ValueError(
                "leader election needs lease_duration > renew_deadline > retry_period > 0, got "
                f"{self.lease_duration} > {self.renew_deadline} > {self.retry_period}"
            )


class LeaderElector:
    """Campaigns for the Lease while running; ``leading`` is set while this replica leads."""

    def __init__(self, config: LeaderElectionConfig) -> None:
        self._cluster: Cluster | None = None
        self.config = config
        self.leading = asyncio.Event()
        self._lost = asyncio.Event()
        self._observed: tuple[str, str] | None = None
        self._observed_at = 0.0
        self.transitions = 0
        self.last_reason: str | None = None

    @property
    def identity(self) -> str:
        return self.config.identity

    async def wait_elected(self) -> None:
        await self.leading.wait()

    async def wait_lost(self) -> None:
        """Wait until the current term ends (returns at once if not leading)."""
        if not self.leading.is_set():
            return
        await self._lost.wait()

    async def run(self, cluster: Cluster) -> None:
        """Campaign on ``cluster`` (the local one): acquire, renew, and on cancellation release.

        Never raises for API trouble; it keeps trying.
        """
        self._cluster = cluster
        try:
            while True:
                await self._acquire()
                await self._renew_until_lost()
        finally:
            if self.leading.is_set():
                await asyncio.shield(self._release())
                self._step_down("released on shutdown")

    async def _acquire(self) -> None:
        while True:
            try:
                if await self._try_acquire_or_renew():
                    self.leading.set()
                    self._lost = asyncio.Event()
                    log.info(
                        "%s became the leader (lease %s/%s)",
                        self.identity,
                        self.config.namespace,
                        self.config.name,
                    )
                    return
            except (APIError, OSError) as error:
                log.debug("leader election: %s", error)
            await asyncio.sleep(self.config.retry_period)

    async def _renew_until_lost(self) -> None:
        last_renewal = time.monotonic()
        while True:
            await asyncio.sleep(self.config.retry_period)
            try:
                async with asyncio.timeout(self.config.renew_deadline):
                    renewed = await self._try_acquire_or_renew()
            except (APIError, OSError, TimeoutError) as error:
                renewed = False
                self.last_reason = str(error) or type(error).__name__
            if renewed:
                last_renewal = time.monotonic()
                continue
            if time.monotonic() - last_renewal >= self.config.renew_deadline - self.config.retry_period:
                self._step_down(
                    f"could not renew the lease within {self.config.renew_deadline:.0f}s"
                    f"{f' ({self.last_reason})' if self.last_reason else ''}"
                )
                return

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

    async def _try_acquire_or_renew(self) -> bool:
        assert self._cluster is not None
        client = self._cluster.client
        now = _micro_time()
        duration = int(self.config.lease_duration)
        try:
            lease = await client.get(LEASE, self.config.name, namespace=self.config.namespace)
        except NotFound:
            fresh = {
                "holderIdentity": self.identity,
                "leaseDurationSeconds": duration,
                "acquireTime": now,
                "renewTime": now,
                "leaseTransitions": 0,
            }
            try:
                await client.create(
                    {
                        "apiVersion": "coordination.k8s.io/v1",
                        "kind": "Lease",
                        "metadata": {"name": self.config.name, "namespace": self.config.namespace},
                        "spec": fresh,
                    }
                )
            except AlreadyExists:
                return False
            self.transitions = 0
            return True
        spec: dict[str, Any] = dict(lease.get("spec") or {})
        holder = str(spec.get("holderIdentity") or "")
        if holder and holder != self.identity and not self._expired(holder, str(spec.get("renewTime", ""))):
            return False
        if holder != self.identity:
            spec["leaseTransitions"] = int(str(spec.get("leaseTransitions") or 0)) + 1
            spec["acquireTime"] = now
        spec.update(holderIdentity=self.identity, leaseDurationSeconds=duration, renewTime=now)
        lease["spec"] = spec
        try:
            await client.update(lease)  # resourceVersion in lease: optimistic concurrency
        except Conflict:
            return False
        self.transitions = int(str(spec.get("leaseTransitions") or 0))
        return True

    async def _release(self) -> None:
        assert self._cluster is not None
        client = self._cluster.client
        try:
            lease = await client.get(LEASE, self.config.name, namespace=self.config.namespace)
            spec = dict(lease.get("spec") or {})
            if spec.get("holderIdentity") != self.identity:
                return
            spec.update(holderIdentity="", leaseDurationSeconds=1, renewTime=_micro_time())
            lease["spec"] = spec
            await client.update(lease)
            log.info("%s released the lease %s/%s", self.identity, self.config.namespace, self.config.name)
        except (APIError, Unreachable, OSError) as error:
            log.warning("%s could not release the lease: %s", self.identity, error)
