"""A crashed replica replaced by a new one: the newcomer counts the dead peer's leftover Lease as gone at once.

Found by running an operator under a Deployment: a crashed pod leaves its
peer Lease behind, the survivors take its shards after a term, and the
replacement pod (a new identity) sees the leftover Lease for the first time.
Judging expiry only by its own observation, it counted the dead peer live
for a whole ``lease_duration``; the survivors, who knew better, handed it
shards it believed were the dead peer's, and those clusters went unworked
for about a lease, with nothing in the log. Survivors now name on their own
peer Lease the peers they watched silent for a term, with the version they
watched; a peer Lease still at that version has not been renewed since.
Against a real hub; the rules themselves are pure logic, tested on a scripted
hub below.
"""

from __future__ import annotations

import copy
import json
import logging
import time
from typing import Any, cast

import pytest
from kube_helpers import running_cluster, unique
from lease_helpers import LEASE, Partition, Partitionable, Seat, coordinating, liveness_through
from prometheus_client import CollectorRegistry

import mcruntime as mcr
from mcruntime._base.errors import NotFound
from mcruntime._coordination.coordinator import WorkGate
from mcruntime._coordination.membership import MAX_CLAIMS, Membership, read_claims
from mcruntime._coordination.rendezvous import owner
from mcruntime._coordination.shardhub import SILENT_ANNOTATION, HubWrites, ShardMetrics
from mcruntime.testing import Fleet, wait_until

# A term long enough that a newcomer's own wait for it would plainly show.
TIMING: Any = {"lease_duration": 8.0, "renew_deadline": 4.0, "retry_period": 0.5}
CLUSTERS = ["", *(f"c{index:02d}" for index in range(12))]


class Exclusive(WorkGate):
    """A replica's work gate that records every cluster it opens while another replica's gate has it open."""

    def __init__(self, gates: list[Exclusive]) -> None:
        super().__init__(list)
        self.gates = gates
        self.doubles: list[set[str]] = []
        gates.append(self)

    def open(self, *clusters: str) -> None:
        for other in self.gates:
            both = set(clusters) & other.opened if other is not self else set()
            if both:
                self.doubles.append(both)
        super().open(*clusters)


def _expected(config: mcr.ShardingConfig, peers: list[str]) -> dict[str, set[str]]:
    weights = dict.fromkeys(peers, 1.0)
    found: dict[str, set[str]] = {peer: set() for peer in peers}
    for cluster in CLUSTERS:
        chosen = owner(str(config.shard_of(cluster)), weights)
        assert chosen is not None
        found[chosen].add(cluster)
    return found


@pytest.mark.timeout(120)
async def test_a_replacement_counts_a_crashed_peers_leftover_lease_as_gone_at_once_and_works_its_share(
    fleet: Fleet, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "mcruntime.sharding")
    namespace = unique("replace")
    link = Partition()
    gates: list[Exclusive] = []
    async with (
        running_cluster(fleet["cluster-1"], "hub") as hub,
        running_cluster(fleet["cluster-1"], "hub-crashing") as crashing_hub,
    ):
        await hub.client.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})

        def replica(identity: str, on: mcr.Cluster) -> tuple[mcr.ShardedCoordinator, Seat]:
            config = mcr.ShardingConfig(name="replace", namespace=namespace, identity=identity, **TIMING)
            return mcr.ShardedCoordinator(config), Seat(on, CLUSTERS, gate=Exclusive(gates))

        real = crashing_hub.client
        crashing_hub.client = Partitionable(real, link)  # type: ignore[assignment]
        (a, seat_a), (b, seat_b) = replica("a", hub), replica("b", hub)
        crashed, crashed_seat = replica("crashed", crashing_hub)
        crashed._liveness = liveness_through(crashing_hub, lambda client: Partitionable(client, link))
        config = a.config
        try:
            async with coordinating(a, seat_a), coordinating(b, seat_b):
                async with coordinating(crashed, crashed_seat):
                    three = _expected(config, ["a", "b", "crashed"])
                    await wait_until(
                        lambda: crashed_seat.work.opened == three["crashed"] and a.owned == three["a"],
                        timeout=30,
                    )
                    # The pod dies: no renewal, no release, its peer Lease and fences stay behind.
                    link.cut = True
                two = _expected(config, ["a", "b"])
                await wait_until(
                    lambda: seat_a.work.opened == two["a"] and seat_b.work.opened == two["b"], timeout=60
                )
                leftover = await hub.client.get(LEASE, config.peer_lease("crashed"), namespace=namespace)
                version = leftover["metadata"]["resourceVersion"]

                async def named_silent() -> bool:
                    lease = await hub.client.get(LEASE, config.peer_lease("a"), namespace=namespace)
                    annotations = lease["metadata"].get("annotations") or {}
                    return bool(read_claims(annotations.get(SILENT_ANNOTATION)) == {"crashed": version})

                await wait_until(named_silent, timeout=30)

                # Its replacement: a new identity, which sees the leftover Lease for the first time.
                joined = len(caplog.records)
                newcomer, newcomer_seat = replica("newcomer", hub)
                async with coordinating(newcomer, newcomer_seat):
                    await wait_until(lambda: newcomer._said.counted is not None, timeout=30)
                    observed = newcomer._members.peers["crashed"].observed
                    assert observed.quiet_for() < config.lease_duration  # its own term has not passed
                    assert set(newcomer.peers()) == {"a", "b", "newcomer"}
                    three = _expected(config, ["a", "b", "newcomer"])
                    await wait_until(
                        lambda: (
                            newcomer_seat.work.opened == three["newcomer"]
                            and seat_a.work.opened == three["a"]
                            and seat_b.work.opened == three["b"]
                        ),
                        timeout=30,
                    )
                    assert newcomer.metrics is not None
                    assert newcomer.metrics.peers._value.get() == 3
        finally:
            crashing_hub.client = real
    assert not [gate.doubles for gate in gates if gate.doubles], "a cluster was open in two replicas at once"
    said = caplog.text
    assert "peer 'crashed' counts as gone: its peer Lease has not been renewed for" in said  # a survivor
    assert (
        "peer 'crashed' counts as gone: its peer Lease has not changed since peer 'a' found it silent" in said
        or "peer 'crashed' counts as gone: its peer Lease has not changed since peer 'b' found it silent"
        in said
    )  # the newcomer, at once
    assert (
        "; taken from 'crashed', which counts as dead: its peer Lease has not" in said
    )  # a survivor took its fences
    handed = [
        record.getMessage() for record in caplog.records[joined:] if "handed shard" in record.getMessage()
    ]
    assert handed and all("over to 'newcomer'" in line and "(clusters " in line for line in handed), handed


# --- the rules, on a scripted hub ---------------------------------------------------------------

CONFIG = mcr.ShardingConfig(
    name="grp", identity="me", lease_duration=3.0, renew_deadline=2.0, retry_period=0.5
)


class Hub:
    """Peer Leases by name as the API server keeps them: each write a new resourceVersion."""

    def __init__(self) -> None:
        self.version = 0
        self.leases: dict[str, dict[str, Any]] = {}

    def store(self, obj: dict[str, Any]) -> dict[str, Any]:
        self.version += 1
        stored = copy.deepcopy(obj)
        stored["metadata"]["resourceVersion"] = str(self.version)
        self.leases[stored["metadata"]["name"]] = stored
        return copy.deepcopy(stored)

    async def create(self, obj: dict[str, Any]) -> dict[str, Any]:
        return self.store(obj)

    async def update(self, obj: dict[str, Any]) -> dict[str, Any]:
        return self.store(obj)

    async def get(self, _kind: Any, name: str, namespace: str | None = None) -> dict[str, Any]:
        del namespace
        if name not in self.leases:
            raise NotFound("not found (scripted hub)", cluster="hub")
        return copy.deepcopy(self.leases[name])


def _peer(hub: Hub, identity: str, renew_time: str, claims: dict[str, str] | None = None) -> dict[str, Any]:
    annotations = {SILENT_ANNOTATION: json.dumps(claims)} if claims else {}
    return hub.store(
        {
            "metadata": {"name": CONFIG.peer_lease(identity), "annotations": annotations},
            "spec": {"holderIdentity": identity, "renewTime": renew_time},
        }
    )


def _watched(members: Membership, lease: dict[str, Any]) -> None:
    meta, spec = lease["metadata"], lease["spec"]
    claims = (meta.get("annotations") or {}).get(SILENT_ANNOTATION, "")
    members.observe(meta["name"], spec["holderIdentity"], spec["renewTime"], "1", lease, "256", claims)


async def _members(hub: Hub) -> Membership:
    writes = HubWrites(CONFIG)
    writes.metrics = ShardMetrics(CollectorRegistry())
    writes.client = cast("Any", hub)
    members = Membership(CONFIG, writes, lambda: None)
    await members.renew(cast("Any", hub))  # alive, and hearing the hub from now
    return members


async def test_a_peer_named_silent_at_the_version_seen_is_gone_and_its_fences_may_be_taken() -> None:
    hub = Hub()
    members = await _members(hub)
    dead = _peer(hub, "dead", "t1")
    _watched(members, dead)
    now = time.monotonic()
    assert "dead" in members.live_peers(now)  # seen just now: a full term of its own ahead
    _watched(members, _peer(hub, "survivor", "s1", {"dead": dead["metadata"]["resourceVersion"]}))
    assert set(members.live_peers(now)) == {"me", "survivor"}
    assert members.silenced_by("dead") == "survivor"
    assert await members.holder_silent("dead", None, now) is True  # the fresh read shows that very version
    assert "peer 'survivor' found it silent" in members.why_silent["dead"]


async def test_a_peer_named_silent_that_renewed_since_is_live_and_its_fences_are_not_taken() -> None:
    hub = Hub()
    members = await _members(hub)
    stale = _peer(hub, "back", "t1")
    _watched(members, stale)
    _watched(members, _peer(hub, "survivor", "s1", {"back": stale["metadata"]["resourceVersion"]}))
    now = time.monotonic()
    assert "back" not in members.live_peers(now)
    # It renewed (SIGSTOP, then SIGCONT) before this replica's informer told it: the read shows
    # a newer version than the one named, and its own term here has not passed.
    _peer(hub, "back", "t2")
    assert await members.holder_silent("back", None, now) is False
    members.confirmed = {}  # a new round
    # Once the informer delivers the renewal, the word no longer matches and the peer is live.
    _watched(members, hub.leases[CONFIG.peer_lease("back")])
    assert members.silenced_by("back") is None
    assert "back" in members.live_peers(time.monotonic())
    assert await members.holder_silent("back", None, time.monotonic()) is False


async def test_a_deleted_peer_lease_is_not_taken_on_a_peers_word() -> None:
    # Deleted and not yet re-created: the holder may still be within its renew deadline.
    hub = Hub()
    members = await _members(hub)
    lease = _peer(hub, "gone", "t1")
    _watched(members, lease)
    _watched(members, _peer(hub, "survivor", "s1", {"gone": lease["metadata"]["resourceVersion"]}))
    del hub.leases[CONFIG.peer_lease("gone")]
    assert await members.holder_silent("gone", None, time.monotonic()) is False
    assert "gone" in members.gone  # the term counts from now


async def test_this_replica_names_on_its_lease_only_peers_silent_a_full_term_and_only_while_alive() -> None:
    hub = Hub()
    members = await _members(hub)
    _watched(members, _peer(hub, "quiet", "t1"))
    _watched(members, _peer(hub, "fresh", "t1"))
    now = time.monotonic()
    later = now + CONFIG.lease_duration + 0.1
    members.peers["fresh"].observed.since = later  # renewed just before ``later``
    members.heard_since = now - CONFIG.lease_duration  # heard the hub all along
    members.renewed_at = later - 0.1
    version = members.peers["quiet"].version
    assert members.silent_peers(later) == {"quiet": version}
    members.claims = members.silent_peers(later)
    await members.renew(cast("Any", hub))
    written = hub.leases[CONFIG.peer_lease("me")]["metadata"]["annotations"]
    assert read_claims(written[SILENT_ANNOTATION]) == {"quiet": version}
    members.renewed_at = later - CONFIG.renew_deadline - 1  # not alive: it may not have heard anyone
    assert members.silent_peers(later) == {}


def test_another_replicas_word_is_read_within_bounds_and_garbage_reads_as_none() -> None:
    assert read_claims('{"a": "12", "b": "7"}') == {"a": "12", "b": "7"}
    assert read_claims('{"a": 12, "": "3", "c": ""}') == {}
    for garbage in ("", "[1, 2]", "{not json", "[" * 16_000, "[" * 100_000, '"text"', 5, None):
        assert read_claims(garbage) == {}
    many = json.dumps({f"peer-{index}": str(index) for index in range(1000)})
    assert len(read_claims(many)) <= MAX_CLAIMS
