"""What every part of sharding shares: its settings, its metrics, and how it writes Leases on the hub.

Membership (peer Leases), fence ownership (fence Leases) and the round that
drives them all write through one :class:`HubWrites`, so every write is
counted by purpose, bounded by the same timeout and checked for a garbled
answer in one place.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import logging
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .._base.errors import APIError, Conflict, NotFound, Unreachable
from .._base.metric import Metrics
from .._base.names import name_problem
from .._base.objects import JSON
from .lease import LEASE, default_identity

if TYPE_CHECKING:
    from prometheus_client import Counter, Gauge

    from .._client.client import Client

log = logging.getLogger("mcruntime.sharding")

GROUP_LABEL = "mcruntime.dev/shard-group"
ROLE_LABEL = "mcruntime.dev/shard-role"
SHARD_ANNOTATION = "mcruntime.dev/shard"
SHARDS_ANNOTATION = "mcruntime.dev/shards"
WEIGHT_ANNOTATION = "mcruntime.dev/weight"
# On a peer Lease: the peers its holder has watched silent for a full term, each with the
# resourceVersion of the peer Lease it watched unchanged (a JSON object, identity → version).
SILENT_ANNOTATION = "mcruntime.dev/silent-peers"
MAX_SHARDS = 4096
WRITE_PURPOSES = (
    "peer-renew",
    "peer-leave",
    "peer-gc",
    "fence-acquire",
    "fence-release",
    "fence-delete",
    "fence-gc",
)
NAME_PATTERN = re.compile(r"^[a-z0-9]([-a-z0-9]{0,38}[a-z0-9])?$")
API_ERRORS = (APIError, Unreachable, OSError, TimeoutError)
CONCURRENT_WRITES = 16
_ANSWERS_A_LEASE = frozenset({"peer-renew", "fence-acquire", "fence-release"})


@dataclass(frozen=True)
class ShardingConfig:
    """Where the Leases live, who this replica is, and how fast work moves.

    ``name`` names the group: every replica of one controller uses the same
    name and namespace. ``weight`` is this replica's relative share.
    ``handover_grace`` is how long in-flight reconciles of a cluster that moves
    to another replica may run before they are cancelled. ``peer_gc_after`` is
    how long a peer must have been silent before a survivor deletes its peer
    Lease (crashed replicas would otherwise leave one behind each), and how
    long a fence must have been quiet, its cluster gone and its holder dead,
    before a survivor deletes it.

    ``shards`` is how many fences the fleet is split into: each cluster falls
    in one shard by a hash of its name, and a replica holds the fence of a
    shard for all its clusters. A failover or handover then writes one fence
    per shard that moves, not one per cluster (about 85 instead of 3,300 for
    a third of 10,000 clusters), and a cold start about ``shards`` in all.
    Every replica of a group must use the same number; one that sees a live
    peer announce another takes no fence until they agree.
    """

    name: str = "mcruntime"
    namespace: str = "default"
    identity: str = field(default_factory=default_identity)
    weight: float = 1.0
    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0
    handover_grace: float = 5.0
    peer_gc_after: float = 300.0
    shards: int = 256

    def __post_init__(self) -> None:
        if not NAME_PATTERN.match(self.name):
            raise ValueError(
                f"sharding group name {self.name!r} must be a lowercase DNS label of at most 40 characters"
            )
        # The Leases' namespace: one the API server refuses (a 422, or a 500 for "..") would
        # leave every replica campaigning forever for fences it can never write.
        namespace: object = self.namespace
        problem: str | None = "must be a string"
        if isinstance(namespace, str):
            problem = name_problem(namespace, subdomain=False)
        if problem is not None:
            raise ValueError(f"sharding namespace {self.namespace!r}: the Leases' namespace {problem}")
        if not self.weight > 0:
            raise ValueError(f"sharding weight must be positive, not {self.weight}")
        if not self.identity:
            raise ValueError("sharding identity must not be empty")
        if not self.lease_duration > self.renew_deadline > self.retry_period > 0:
            raise ValueError(
                "sharding needs lease_duration > renew_deadline > retry_period > 0, got "
                f"{self.lease_duration} > {self.renew_deadline} > {self.retry_period}"
            )
        if self.handover_grace < 0:
            raise ValueError(f"handover_grace must not be negative, not {self.handover_grace}")
        if not self.peer_gc_after > self.lease_duration:
            raise ValueError(
                f"peer_gc_after ({self.peer_gc_after}) must be longer than "
                f"lease_duration ({self.lease_duration})"
            )
        if (
            isinstance(self.shards, bool)
            or not isinstance(self.shards, int)
            or not 1 <= self.shards <= MAX_SHARDS
        ):
            raise ValueError(
                f"sharding shards must be a whole number from 1 to {MAX_SHARDS}, not {self.shards!r}"
            )

    def peer_lease(self, identity: str) -> str:
        return f"{self.name}-peer-{digest(identity)}"

    def shard_of(self, cluster: str) -> int:
        """The shard ``cluster`` falls in: the same on every replica with the same ``shards``."""
        return shard_index(cluster, self.shards)

    def shard_fence(self, shard: int) -> str:
        """The fence Lease of one shard; the count is in the name, so groups that disagree never share one."""
        return f"{self.name}-fence-{self.shards}-{shard}"

    def fence_lease(self, cluster: str) -> str:
        """The fence Lease that guards ``cluster``: its shard's."""
        return self.shard_fence(self.shard_of(cluster))


def digest(text: str) -> str:
    return hashlib.blake2b(text.encode(), digest_size=8).hexdigest()


@functools.lru_cache(maxsize=1 << 16)
def shard_index(cluster: str, shards: int) -> int:
    """A well-mixed shard for a cluster name (blake2b, so similar names spread evenly)."""
    value = int.from_bytes(hashlib.blake2b(cluster.encode(), digest_size=8).digest(), "big")
    return value % shards


class ShardMetrics:
    """What an operator watches: ownership, its changes, and what this replica writes on the hub."""

    def __init__(self, registry: Any) -> None:
        metric = Metrics(registry)
        self.owned: Gauge = metric.gauge(
            "mcruntime_shard_clusters_owned", "Clusters whose fence this replica holds"
        )
        self.peers: Gauge = metric.gauge("mcruntime_shard_peers", "Live peers in the shard group")
        self.ownership_changes: Counter = metric.counter(
            "mcruntime_shard_ownership_changes_total",
            "Clusters that became or stopped being this replica's by rendezvous hashing",
            ("direction",),
        )
        self.fence_acquisitions: Counter = metric.counter(
            "mcruntime_shard_fence_acquisitions_total", "Fences this replica acquired"
        )
        self.fence_releases: Counter = metric.counter(
            "mcruntime_shard_fence_releases_total", "Fences this replica released on handover or shutdown"
        )
        self.fence_losses: Counter = metric.counter(
            "mcruntime_shard_fence_losses_total",
            "Fences lost: taken over, deleted, or dropped when this replica missed its renew deadline",
        )
        self.hub_writes: Counter = metric.counter(
            "mcruntime_shard_hub_writes_total",
            "Lease writes (create, update, delete) this replica sent to the hub, by purpose",
            ("purpose",),
        )
        self.loop_lag: Gauge = metric.gauge(
            "mcruntime_shard_event_loop_lag_seconds",
            "How late the event loop last ran the sharding's pulse; liveness stops past lease_duration",
        )
        self.loop_failures: Counter = metric.counter(
            "mcruntime_shard_loop_failures_total",
            "Coordination rounds that failed and sharding loops that died, unexpectedly "
            "(logged and retried with backoff)",
        )
        for purpose in WRITE_PURPOSES:
            self.hub_writes.labels(purpose)


class HubWrites:
    """Lease writes on the hub, counted by purpose, each bounded by the sharding's request timeout."""

    def __init__(self, config: ShardingConfig) -> None:
        self.config = config
        # A request may take longer than a retry period on a busy hub; half the renew
        # deadline still leaves a second attempt before the watchdog stops the work.
        self.request_timeout = max(config.retry_period, config.renew_deadline / 2)
        self.client: Client | None = None
        self.metrics: ShardMetrics | None = None

    async def write(self, purpose: str, request: Callable[[], Awaitable[JSON | None]]) -> JSON | None:
        """One Lease write, counted by purpose; a garbled answer raises ``ValueError``."""
        assert self.metrics is not None
        self.metrics.hub_writes.labels(purpose).inc()
        answer = await request()
        if purpose in _ANSWERS_A_LEASE and not (
            isinstance(answer, dict) and isinstance(answer.get("metadata"), dict)
        ):
            raise ValueError(
                f"the hub answered a Lease write ({purpose}) with no Lease: {str(answer)[:120]!r}"
            )
        return answer

    def why(self, error: BaseException) -> str:
        """An error worded for the log; a timeout's message is empty, so say what it was."""
        if isinstance(error, TimeoutError) and not str(error):
            return f"no answer within {self.request_timeout:g}s"
        return str(error) or type(error).__name__

    async def delete_as_seen(self, purpose: str, lease: JSON, what: str) -> bool:
        """Delete ``lease`` only if it is still the version watched; whether this call deleted it.

        The resourceVersion precondition is what makes collecting safe: a
        Lease renewed or taken since it was seen survives (Conflict).
        """
        assert self.client is not None
        client = self.client
        meta = lease.get("metadata") or {}
        name = str(meta.get("name", ""))
        version = str(meta.get("resourceVersion", ""))
        if not name or not version:
            return False
        try:
            async with asyncio.timeout(self.request_timeout):
                await self.write(
                    purpose,
                    functools.partial(
                        client.delete, LEASE, name, namespace=self.config.namespace, resource_version=version
                    ),
                )
        except (NotFound, Conflict):
            return False
        except API_ERRORS as error:
            log.warning("sharding %s: could not delete %s: %s", self.config.name, what, self.why(error))
            return False
        return True
