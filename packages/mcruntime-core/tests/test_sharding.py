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
import json
import signal
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from kube_helpers import CONFIGMAP, running_cluster, unique
from shard_replica import CLUSTER_LABEL

import mcruntime as mcr
from mcruntime._coordination.coordinator import Seat
from mcruntime._coordination.rendezvous import owner as rendezvous_owner
from mcruntime.testing import Fleet, running, wait_until

CLUSTERS = [f"c{index:02d}" for index in range(30)]
SCRIPT = Path(__file__).with_name("shard_replica.py")


@dataclass
class Replica:
    identity: str
    process: asyncio.subprocess.Process
    owned: set[str] = field(default_factory=set)
    history: list[tuple[float, frozenset[str]]] = field(default_factory=list)
    stopped: bool = False
    reader: asyncio.Task[None] | None = None

    async def follow(self) -> None:
        assert self.process.stdout is not None
        async for line in self.process.stdout:
            try:
                report = json.loads(line)
            except ValueError:
                continue
            if "owned" in report:
                self.owned = set(report["owned"])
                self.history.append((time.monotonic(), frozenset(self.owned)))
            if report.get("stopped"):
                self.stopped = True


@dataclass
class Writes:
    """Every stamped version of every cluster's ConfigMap, in the order its API server applied them."""

    by_cluster: dict[str, list[tuple[float, str]]] = field(default_factory=dict)
    fences: dict[str, list[str]] = field(default_factory=dict)  # cluster → fence version of each write

    def record(self, obj: dict[str, Any]) -> None:
        cluster = (obj["metadata"].get("labels") or {}).get(CLUSTER_LABEL)
        data = obj.get("data") or {}
        writer = data.get("writer")
        if cluster and writer:
            self.by_cluster.setdefault(cluster, []).append((time.monotonic(), writer))
            self.fences.setdefault(cluster, []).append(str(data.get("fence", "")))

    def last_writer(self, cluster: str, since: float = 0.0) -> str | None:
        recent = [writer for moment, writer in self.by_cluster.get(cluster, []) if moment >= since]
        return recent[-1] if recent else None

    def first_write_by(self, cluster: str, writers: set[str], since: float) -> float | None:
        for moment, writer in self.by_cluster.get(cluster, []):
            if moment >= since and writer in writers:
                return moment
        return None

    def superseded(self) -> dict[str, list[str]]:
        """Clusters written under a fence after another replica had written under a newer one.

        Each write carries the resourceVersion of the fence its writer held
        (a write with none counts as the oldest). A replica that wrote, lost its
        shard and wrote again after taking it back stamps a newer fence the
        second time; a replica that went on writing after another took its
        fence stamps the old one: two owners at once. Each found cluster lists
        its writes as ``writer@fence``.
        """
        found = {}
        for cluster, writes in self.by_cluster.items():
            newest, newest_writer = -1, ""
            stamped = [
                (writer, fence) for (_, writer), fence in zip(writes, self.fences[cluster], strict=True)
            ]
            for writer, fence in stamped:
                version = int(fence) if fence.isdigit() else -1
                if version < newest and writer != newest_writer:
                    found[cluster] = [f"{w}@{f or 'none'}" for w, f in stamped]
                    break
                if version > newest:
                    newest, newest_writer = version, writer
        return found


@dataclass
class Shards:
    fleet: Fleet
    spec_path: Path
    spec: dict[str, Any]
    writes: Writes
    replicas: dict[str, Replica] = field(default_factory=dict)
    clusters: list[str] = field(default_factory=lambda: list(CLUSTERS))

    async def start(self, identity: str, weight: float = 1.0) -> Replica:
        with (self.spec_path.parent / f"{identity}.log").open("ab") as log_file:
            process = await asyncio.create_subprocess_exec(
                sys.executable,
                str(SCRIPT),
                str(self.spec_path),
                identity,
                str(weight),
                stdout=asyncio.subprocess.PIPE,
                stderr=log_file,
            )
        replica = Replica(identity, process)
        replica.reader = asyncio.create_task(replica.follow())
        self.replicas[identity] = replica
        return replica

    def live(self) -> dict[str, Replica]:
        return {
            name: r for name, r in self.replicas.items() if r.process.returncode is None and not r.stopped
        }

    def expected(self, weights: dict[str, float]) -> dict[str, set[str]]:
        result: dict[str, set[str]] = {name: set() for name in weights}
        config = mcr.ShardingConfig(shards=self.spec.get("shards", mcr.ShardingConfig.shards))
        for cluster in [*self.clusters, mcr.LOCAL_CLUSTER]:  # the hub's own work is sharded too
            # Clusters move a shard at a time: the owner of the cluster's shard owns it.
            chosen = rendezvous_owner(str(config.shard_of(cluster)), weights)
            assert chosen is not None
            result[chosen].add(cluster)
        return result

    async def settled(self, weights: dict[str, float], since: float = 0.0, timeout: float = 60.0) -> None:
        """Wait until each live replica owns exactly its rendezvous share and has written all of it."""
        expected = self.expected(weights)

        def done() -> bool:
            live = self.live()
            if set(live) != set(weights):
                return False
            for name, clusters in expected.items():
                if live[name].owned != clusters:
                    return False
                if any(self.writes.last_writer(c, since) != name for c in clusters if c):
                    return False
            return True

        try:
            await wait_until(done, timeout=timeout, interval=0.05 if len(self.clusters) <= 100 else 0.5)
        except AssertionError as error:
            raise AssertionError(f"{error}\n{self.describe(expected, since)}") from None

    def describe(self, expected: dict[str, set[str]], since: float) -> str:
        """What each replica owns against what it should, its unwritten clusters, and its log's tail."""
        lines = []
        for name, replica in self.replicas.items():
            want = expected.get(name, set())
            unwritten = sorted(c for c in want if c and self.writes.last_writer(c, since) != name)
            log_path = self.spec_path.parent / f"{name}.log"
            tail = log_path.read_text().splitlines()[-8:] if log_path.exists() else []
            lines.append(
                f"{name} (exit {replica.process.returncode}): owns {sorted(replica.owned)}, "
                f"expected {sorted(want)}, unwritten {unwritten}"
            )
            lines.extend(f"    {line}" for line in tail)
        return "\n".join(lines)

    async def close(self) -> None:
        for replica in self.replicas.values():
            if replica.process.returncode is None:
                replica.process.kill()
            await replica.process.wait()
            if replica.reader is not None:
                replica.reader.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await replica.reader


@contextlib.asynccontextmanager
async def shard_group(
    fleet: Fleet,
    tmp_path: Path,
    *,
    lease_duration: float = 3.0,
    renew_deadline: float = 2.0,
    names: list[str] | None = None,
    extra: dict[str, Any] | None = None,
) -> AsyncIterator[Shards]:
    """Clusters (30 unless ``names``) over the fleet's three API servers, one ConfigMap each, and a watch on them."""
    names = names or list(CLUSTERS)
    namespace = unique("shards")
    planes = [fleet["cluster-1"], fleet["cluster-2"], fleet["cluster-3"]]
    clusters = {name: str(planes[index % 3].kubeconfig_path()) for index, name in enumerate(names)}
    spec = {
        "hub": str(planes[0].kubeconfig_path()),
        "clusters": clusters,
        "namespace": namespace,
        "group": "shards",
        "lease_duration": lease_duration,
        "renew_deadline": renew_deadline,
        "retry_period": 0.5,
        "period": 1.0,
        **(extra or {}),
    }
    tmp_path.mkdir(parents=True, exist_ok=True)
    spec_path = tmp_path / "spec.json"
    spec_path.write_text(json.dumps(spec))
    writes = Writes()
    creating = asyncio.Semaphore(16)
    async with contextlib.AsyncExitStack() as stack:
        for index, plane in enumerate(planes):
            cluster = await stack.enter_async_context(running_cluster(plane, f"watch-{index}"))
            await cluster.client.create(
                {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}
            )

            async def create(name: str, client: mcr.Client = cluster.client) -> None:
                async with creating:
                    await client.create(
                        {
                            "apiVersion": "v1",
                            "kind": "ConfigMap",
                            "metadata": {
                                "name": name,
                                "namespace": namespace,
                                "labels": {CLUSTER_LABEL: name},
                            },
                            "data": {"count": "0"},
                        }
                    )

            await asyncio.gather(*(create(name) for name in names[index::3]))
            informer = cluster.cache.informer(CONFIGMAP, namespace=namespace)
            informer.add_handler(mcr.ResourceEventHandler(on_update=lambda _old, new: writes.record(new)))
            assert await informer.wait_for_sync(30)
        shards = Shards(fleet, spec_path, spec, writes, clusters=names)
        try:
            yield shards
        finally:
            await shards.close()
        superseded = writes.superseded()
        assert not superseded, f"a replica wrote under a fence another had taken since: {superseded}"


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
