"""Sharding across replicas: real manager processes against one hub and a fleet of 30 clusters.

The 30 clusters are names over the three testbed API servers; each cluster's
work is one ConfigMap labelled with its name. The test watches every
ConfigMap and records, in order, which replica wrote each version: a second
writer while a fence is held would show up as a cluster going back to a
replica it had left.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import signal
import time
from pathlib import Path
from typing import Any

import pytest
from kube_helpers import CONFIGMAP, running_cluster, unique
from shard_group import CLUSTERS, Writes, shard_group
from shard_replica import CLUSTER_LABEL

import mcruntime as mcr
from mcruntime._coordination.coordinator import Seat
from mcruntime.testing import Fleet, running, wait_until


@pytest.mark.timeout(240)
async def test_three_replicas_split_thirty_clusters_and_survive_a_crash(fleet: Fleet, tmp_path: Path) -> None:
    async with shard_group(fleet, tmp_path) as shards:
        for identity in ("replica-a", "replica-b", "replica-c"):
            await shards.start(identity)
        weights = {"replica-a": 1.0, "replica-b": 1.0, "replica-c": 1.0}
        await shards.settled(weights)
        shares = {name: len(replica.owned - {""}) for name, replica in shards.live().items()}
        assert all(abs(share - 10) <= 5 for share in shares.values()), shares
        assert set().union(*(r.owned for r in shards.live().values())) == {*CLUSTERS, ""}

        before = {name: set(replica.owned) for name, replica in shards.live().items()}
        doomed = shards.replicas["replica-c"]
        orphans = set(doomed.owned)
        doomed.process.send_signal(signal.SIGKILL)
        await doomed.process.wait()
        killed_at = time.monotonic()
        survivors = {"replica-a": 1.0, "replica-b": 1.0}
        await shards.settled(survivors, since=killed_at)

        # Only the dead replica's clusters moved.
        for name in survivors:
            assert before[name] <= shards.replicas[name].owned
        assert shards.replicas["replica-a"].owned | shards.replicas["replica-b"].owned == {*CLUSTERS, ""}
        moved = (shards.replicas["replica-a"].owned | shards.replicas["replica-b"].owned) - (
            before["replica-a"] | before["replica-b"]
        )
        assert moved == orphans
        # ... and each was reconciled by a survivor after the crash. How fast is measured in
        # benchmarks/ (the core README's sharding figures), not asserted on a shared machine.
        taken = [shards.writes.first_write_by(c, set(survivors), killed_at) for c in orphans if c]
        assert all(moment is not None for moment in taken)


@pytest.mark.timeout(240)
async def test_a_new_replica_takes_about_a_quarter_and_nothing_else_moves(
    fleet: Fleet, tmp_path: Path
) -> None:
    async with shard_group(fleet, tmp_path) as shards:
        three = {"replica-a": 1.0, "replica-b": 1.0, "replica-c": 1.0}
        for identity in three:
            await shards.start(identity)
        await shards.settled(three)
        before = {name: set(replica.owned) for name, replica in shards.live().items()}

        joined_at = time.monotonic()
        await shards.start("replica-d")
        four = {**three, "replica-d": 1.0}
        await shards.settled(four, since=joined_at)
        newcomer = shards.replicas["replica-d"].owned
        for name in three:
            # Each old replica only gave clusters away, and only to the newcomer.
            assert shards.replicas[name].owned <= before[name]
            assert before[name] - shards.replicas[name].owned <= newcomer
        taken = len(newcomer - {""})
        print(f"a fourth replica took {taken} of {len(CLUSTERS)} clusters")
        assert abs(taken - len(CLUSTERS) / 4) <= 5


@pytest.mark.timeout(240)
async def test_graceful_stop_releases_fences_for_an_immediate_handover(fleet: Fleet, tmp_path: Path) -> None:
    async with shard_group(fleet, tmp_path, lease_duration=20.0, renew_deadline=10.0) as shards:
        three = {"replica-a": 1.0, "replica-b": 1.0, "replica-c": 1.0}
        for identity in three:
            await shards.start(identity)
        await shards.settled(three)
        leaving = shards.replicas["replica-b"]
        handed = set(leaving.owned)
        leaving.process.send_signal(signal.SIGTERM)
        stopped_at = time.monotonic()
        assert await leaving.process.wait() == 0
        remaining = {"replica-a": 1.0, "replica-c": 1.0}
        await shards.settled(remaining, since=stopped_at, timeout=30)
        taken = [shards.writes.first_write_by(c, set(remaining), stopped_at) for c in handed if c]
        handover = max(moment for moment in taken if moment is not None) - stopped_at
        print(f"handover after a graceful stop: {handover:.2f}s for {len(handed)} clusters")
        # Far below the 20 s lease: nobody waited for an expiry.
        assert handover < shards.spec["lease_duration"] / 2
        async with running_cluster(fleet["cluster-1"], "hub") as hub:
            leases = await hub.client.list(
                mcr.Kind("coordination.k8s.io/v1", "Lease"), namespace=shards.spec["namespace"]
            )
        holders = {
            item["metadata"]["name"]: item["spec"].get("holderIdentity")
            for item in leases.items
            if item["metadata"]["labels"].get("mcruntime.dev/shard-role") == "fence"
        }
        assert "replica-b" not in holders.values()
        peers = {
            item["spec"].get("holderIdentity")
            for item in leases.items
            if "-peer-" in item["metadata"]["name"]
        }
        assert peers == {"replica-a", "replica-c"}


async def test_sharded_manager_in_process_reports_metrics_and_releases_on_stop(
    fleet: Fleet, tmp_path: Path
) -> None:
    from shard_replica import sharded_manager

    namespace = unique("solo")
    plane = fleet["cluster-2"]
    async with running_cluster(plane, "setup") as setup:
        await setup.client.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
        for name in ("x", "y"):
            await setup.client.create(
                {
                    "apiVersion": "v1",
                    "kind": "ConfigMap",
                    "metadata": {"name": name, "namespace": namespace, "labels": {CLUSTER_LABEL: name}},
                }
            )
        spec = {
            "hub": str(plane.kubeconfig_path()),
            "clusters": {"x": str(plane.kubeconfig_path()), "y": str(plane.kubeconfig_path())},
            "namespace": namespace,
            "group": "solo",
            "lease_duration": 3.0,
            "renew_deadline": 2.0,
            "retry_period": 0.5,
            "period": 0.5,
        }
        manager = sharded_manager(spec, "only", 1.0, handle_signals=False)
        coordinator = manager.coordinator
        assert isinstance(coordinator, mcr.ShardedCoordinator)

        async def stamped(name: str) -> bool:
            found = await setup.client.get(CONFIGMAP, name, namespace=namespace)
            return (found.get("data") or {}).get("writer") == "only"

        runner = asyncio.create_task(manager.start())
        try:
            # The local cluster ("") is a shard too: one replica owns the hub's own work.
            await wait_until(lambda: coordinator.owned == {"", "x", "y"}, timeout=30)
            await wait_until(lambda: stamped("x"), timeout=30)
            await wait_until(lambda: stamped("y"), timeout=30)
            sample = manager.registry.get_sample_value
            assert sample("mcruntime_shard_clusters_owned") == 3
            assert sample("mcruntime_shard_peers") == 1
            assert sample("mcruntime_shard_fence_acquisitions_total") == 3
            assert sample("mcruntime_shard_fence_losses_total") == 0
            # Hub writes by purpose: three fence acquisitions, then only peer renewals.
            assert sample("mcruntime_shard_hub_writes_total", {"purpose": "fence-acquire"}) == 3
            renewals = sample("mcruntime_shard_hub_writes_total", {"purpose": "peer-renew"}) or 0
            await wait_until(
                lambda: (
                    (sample("mcruntime_shard_hub_writes_total", {"purpose": "peer-renew"}) or 0)
                    >= renewals + 2
                ),
                timeout=10,
            )
            assert sample("mcruntime_shard_hub_writes_total", {"purpose": "fence-acquire"}) == 3
        finally:
            manager.stop()
            await runner
        leases = await setup.client.list(mcr.Kind("coordination.k8s.io/v1", "Lease"), namespace=namespace)
        assert {item["spec"].get("holderIdentity") for item in leases.items} == {""}
        assert all("-fence-" in item["metadata"]["name"] for item in leases.items)
        assert manager.registry.get_sample_value("mcruntime_shard_fence_releases_total") == 3


def test_a_write_under_a_fence_taken_since_is_told_from_a_return_after_retaking_it() -> None:
    def stamped(name: str, writer: str, fence: str) -> dict[str, Any]:
        return {"metadata": {"labels": {CLUSTER_LABEL: name}}, "data": {"writer": writer, "fence": fence}}

    writes = Writes()
    for cluster, history in {
        "returned": [("a", "5"), ("b", "7"), ("a", "9")],  # a took its shard back: a newer fence
        "second-owner": [("a", "5"), ("b", "7"), ("a", "5")],  # a wrote on after b took the fence
        "unfenced": [("a", "5"), ("b", "")],  # b wrote holding no fence at all
        "steady": [("a", "5"), ("a", "5")],
    }.items():
        for writer, fence in history:
            writes.record(stamped(cluster, writer, fence))
    assert writes.superseded() == {
        "second-owner": ["a@5", "b@7", "a@5"],
        "unfenced": ["a@5", "b@none"],
    }


def test_sharding_and_leader_election_are_alternatives(fleet: Fleet) -> None:
    config = mcr.kubeconfig_from_dict(fleet["cluster-1"].kubeconfig())
    with pytest.raises(ValueError, match="not both"):
        mcr.Manager(
            local=config,
            leader_election=mcr.LeaderElectionConfig(name="x"),
            coordinator=mcr.ShardedCoordinator(),
        )
    with pytest.raises(ValueError, match="lowercase DNS label"):
        mcr.ShardingConfig(name="Not_A_Label")
    with pytest.raises(ValueError, match="lease_duration > renew_deadline > retry_period"):
        mcr.ShardingConfig(lease_duration=5, renew_deadline=6)


class ManualCoordinator:
    """A bring-your-own coordinator: the test opens and closes clusters itself."""

    def __init__(self) -> None:
        self.seat: Seat | None = None

    async def run(self, seat: Seat) -> None:
        self.seat = seat
        await asyncio.Event().wait()  # holds nothing, so nothing to release when cancelled


async def test_closing_one_cluster_ends_only_its_work_and_opening_replays_the_cache(fleet: Fleet) -> None:
    planes = {"east": fleet["cluster-2"], "west": fleet["cluster-3"]}
    namespace = unique("gate")
    async with contextlib.AsyncExitStack() as stack:
        setups = {}
        for name, plane in planes.items():
            setups[name] = await stack.enter_async_context(running_cluster(plane, f"setup-{name}"))
            await setups[name].client.create(
                {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}
            )
            await setups[name].client.create(
                {
                    "apiVersion": "v1",
                    "kind": "ConfigMap",
                    "metadata": {"name": "work", "namespace": namespace},
                }
            )
        coordinator = ManualCoordinator()
        provider = mcr.StaticProvider(
            {name: mcr.kubeconfig_from_dict(plane.kubeconfig()) for name, plane in planes.items()}
        )
        manager = mcr.Manager(
            provider,
            local=mcr.kubeconfig_from_dict(fleet["cluster-1"].kubeconfig()),
            coordinator=coordinator,
            handle_signals=False,
        )
        started: dict[str, int] = {"east": 0, "west": 0}
        cancelled: list[str] = []
        release = asyncio.Event()

        async def reconcile(request: mcr.Request) -> None:
            started[request.cluster] += 1
            if request.cluster == "east":
                try:
                    await asyncio.Event().wait()  # east's work never ends by itself
                except asyncio.CancelledError:
                    cancelled.append(request.cluster)
                    raise
            await release.wait()

        (
            mcr.controller_managed_by(manager)
            .for_(CONFIGMAP, namespace=namespace, clusters=mcr.PROVIDER_ONLY)
            .with_options(max_concurrent_reconciles=2)
            .complete(reconcile)
        )
        async with running(manager):
            controller = manager.controllers["configmap"]
            await wait_until(lambda: all(controller.synced(name) for name in planes), timeout=30)
            assert started == {"east": 0, "west": 0}  # nothing is worked on until opened
            manager.work.open("east", "west")  # replays the warm caches
            await wait_until(lambda: started == {"east": 1, "west": 1})
            await manager.work.close("east")
            assert cancelled == ["east"]
            assert "east" not in {r.cluster for r in controller._current.values()}
            # west's reconcile was not touched and finishes normally.
            release.set()
            await wait_until(lambda: controller.stats.success == 1)
            # Events of a closed cluster are dropped; reopening replays what the cache holds.
            await setups["east"].client.patch(CONFIGMAP, "work", {"data": {"v": "2"}}, namespace=namespace)
            await setups["west"].client.patch(CONFIGMAP, "work", {"data": {"v": "2"}}, namespace=namespace)
            await wait_until(lambda: started["west"] == 2)
            assert started["east"] == 1
            manager.work.open("east")
            await wait_until(lambda: started["east"] == 2)
            await manager.work.close("east")
            assert coordinator.seat is manager


def test_sharding_from_settings(fleet: Fleet, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MCRUNTIME_SHARDING", "true")
    monkeypatch.setenv("MCRUNTIME_SHARD_GROUP", "fleet-ctl")
    monkeypatch.setenv("MCRUNTIME_SHARD_WEIGHT", "2")
    monkeypatch.setenv("MCRUNTIME_SHARD_COUNT", "64")
    monkeypatch.setenv("MCRUNTIME_METRICS_BIND_ADDRESS", "")
    monkeypatch.setenv("MCRUNTIME_HEALTH_PROBE_BIND_ADDRESS", "")
    manager = mcr.Manager.from_settings(local=mcr.kubeconfig_from_dict(fleet["cluster-1"].kubeconfig()))
    assert isinstance(manager.coordinator, mcr.ShardedCoordinator)
    config = manager.coordinator.config
    assert config.name == "fleet-ctl" and config.weight == 2 and config.shards == 64
    monkeypatch.setenv("MCRUNTIME_LEADER_ELECTION", "true")
    with pytest.raises(mcr.SettingsError, match="MCRUNTIME_SHARDING are alternatives"):
        mcr.ManagerSettings.load()


def _fence(group: str, namespace: str, cluster: str, holder: str, *, legacy: bool = False) -> dict[str, Any]:
    """The fence Lease of ``cluster``'s shard as a replica of ``group`` writes it, held by ``holder``.

    ``legacy``: a fence of ``cluster`` alone, as releases before shard fences wrote them.
    """
    config = mcr.ShardingConfig(name=group)
    shard = config.shard_of(cluster)
    name, annotations = (
        (
            f"{group}-fence-{hashlib.blake2b(cluster.encode(), digest_size=8).hexdigest()}",
            {"mcruntime.dev/cluster": cluster},
        )
        if legacy
        else (config.fence_lease(cluster), {"mcruntime.dev/shard": str(shard), "mcruntime.dev/shards": "256"})
    )
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {"mcruntime.dev/shard-group": group, "mcruntime.dev/shard-role": "fence"},
            "annotations": annotations,
        },
        "spec": {
            "holderIdentity": holder,
            "leaseDurationSeconds": 3,
            "renewTime": time.strftime("%Y-%m-%dT%H:%M:%S.000000Z", time.gmtime()),
        },
    }


async def test_fences_of_shards_gone_while_their_holder_was_dead_are_collected(fleet: Fleet) -> None:
    from shard_replica import sharded_manager

    namespace = unique("orphans")
    plane = fleet["cluster-3"]
    group = "orphans"
    lease = mcr.Kind("coordination.k8s.io/v1", "Lease")
    async with running_cluster(plane, "setup") as setup:
        await setup.client.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
        await setup.client.create(
            {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x", "namespace": namespace}}
        )
        # A replica that crashed holding the shard of "gone", and a released fence of the shard
        # of "left": neither cluster is in the fleet any more, and nobody alive will ever hand
        # them over. And a per-cluster fence of "x" from a release before shard fences, which
        # nobody of this release will ever take.
        for cluster, holder in (("gone", "crashed-replica"), ("left", "")):
            await setup.client.create(_fence(group, namespace, cluster, holder))
        legacy = _fence(group, namespace, "x", "old-replica", legacy=True)
        await setup.client.create(legacy)
        spec = {
            "hub": str(plane.kubeconfig_path()),
            "clusters": {"x": str(plane.kubeconfig_path())},
            "namespace": namespace,
            "group": group,
            "lease_duration": 1.5,
            "renew_deadline": 1.0,
            "retry_period": 0.25,
            "peer_gc_after": 2.0,
            "period": 0.5,
        }
        manager = sharded_manager(spec, "survivor", 1.0, handle_signals=False)
        coordinator = manager.coordinator
        assert isinstance(coordinator, mcr.ShardedCoordinator)
        config = mcr.ShardingConfig(name=group)

        async def fences() -> set[str]:
            found = await setup.client.list(lease, namespace=namespace)
            return {item["metadata"]["name"] for item in found.items if "-fence-" in item["metadata"]["name"]}

        runner = asyncio.create_task(manager.start())
        try:
            await wait_until(lambda: coordinator.owned == {"", "x"}, timeout=30)
            orphans = {config.fence_lease("gone"), config.fence_lease("left"), legacy["metadata"]["name"]}
            await wait_until(lambda: _without(fences(), orphans), timeout=30)
            # The fences of the shards of clusters in the fleet stay, held by the survivor.
            assert await fences() == {config.fence_lease(""), config.fence_lease("x")}
            sample = manager.registry.get_sample_value
            assert sample("mcruntime_shard_hub_writes_total", {"purpose": "fence-gc"}) == 3
        finally:
            manager.stop()
            await runner


async def _without(found: Any, names: set[str]) -> bool:
    return not (await found) & names
