"""A peer's silence counts only while this replica could hear the hub.

When the hub hangs, every replica's renewals fail and every peer looks silent
to every other. Found by SIGSTOPping a hub under two sharded replicas: when it
answered again, each took the other's fences while both were alive, and the
losers stopped work they had just resumed. This replica's own return to the
hub now starts a peer's term afresh. Pure logic: the peer Lease writes go to
a scripted client.
"""

from __future__ import annotations

import copy
import time
from typing import Any, cast

from prometheus_client import CollectorRegistry

import mcruntime as mcr
from mcruntime._coordination.membership import Membership
from mcruntime._coordination.shardhub import HubWrites, ShardMetrics

CONFIG = mcr.ShardingConfig(
    name="grp", identity="me", lease_duration=3.0, renew_deadline=2.0, retry_period=0.5
)


class Hub:
    """Answers the peer Lease's create and updates as the API server would, with a new resourceVersion."""

    def __init__(self) -> None:
        self.version = 0

    async def _stored(self, obj: dict[str, Any]) -> dict[str, Any]:
        self.version += 1
        stored = copy.deepcopy(obj)
        stored["metadata"]["resourceVersion"] = str(self.version)
        return stored

    async def create(self, obj: dict[str, Any]) -> dict[str, Any]:
        return await self._stored(obj)

    async def update(self, obj: dict[str, Any]) -> dict[str, Any]:
        return await self._stored(obj)


def _membership() -> Membership:
    writes = HubWrites(CONFIG)
    writes.metrics = ShardMetrics(CollectorRegistry())
    return Membership(CONFIG, writes, lambda: None)


async def test_a_peer_unheard_while_this_replica_lost_the_hub_is_not_silent_until_a_term_after_its_return() -> (
    None
):
    members, hub = _membership(), cast("Any", Hub())
    await members.renew(hub)
    assert members.heard_since is not None
    members.observe("grp-peer-other", "other", "t1", "1.0", {"metadata": {}})
    now = time.monotonic()
    # An outage of this replica (a hung hub): its last renewal and its last sight of the
    # peer lie two terms back.
    long_ago = now - 2 * CONFIG.lease_duration
    members.renewed_at = long_ago
    members.heard_since = long_ago
    members.peers["other"].observed.since = long_ago
    assert "other" not in members.live_peers(now)  # before the return: silent, as far as it knows
    # The hub answers again: a lapse, and hearing starts again.
    await members.renew(hub)
    assert members.lapses == 1
    now = time.monotonic()
    assert members.last_sign_of_life("other", None) >= members.heard_since
    assert await members.holder_silent("other", None, now) is False  # a full term from the return
    assert "other" in members.live_peers(now)
    # A term after the return with still no sign of the peer, it is silent (then confirmed by a read).
    later = members.heard_since + CONFIG.lease_duration + 0.1
    assert "other" not in members.live_peers(later)
    assert members.last_sign_of_life("other", None) + CONFIG.lease_duration < later


async def test_a_replica_that_never_lost_the_hub_keeps_counting_from_its_first_renewal() -> None:
    members, hub = _membership(), cast("Any", Hub())
    await members.renew(hub)
    first = members.heard_since
    await members.renew(hub)
    assert members.heard_since == first and members.lapses == 0
