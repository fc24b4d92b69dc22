"""The sharding coordinator's fences: one stuck or failing fence blocks nothing else, partitions, handovers.

Against real API servers. A replica cut off from its hub stops within the
renew deadline and resumes; a leader renews from its heartbeat thread while
its loop is blocked; a handover of many clusters bounds the writes to the hub.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

import pytest
from kube_helpers import running_cluster, unique
from lease_helpers import FAST, LEASE, Partition, Partitionable, Seat, coordinating, liveness_through

import mcruntime as mcr
from mcruntime._coordination.coordinator import WorkGate
from mcruntime.coordination import LeaderElector
from mcruntime.testing import Fleet, wait_until


class StuckGate(WorkGate):
    """A gate whose close of ``stuck`` never finishes (a reconcile that ignores cancellation)."""

    def __init__(self) -> None:
        super().__init__(list)
        self.closing: set[str] = set()

    async def close(self, cluster: str, *, grace: float = 0.0) -> None:
        self.closing.add(cluster)
        await super().close(cluster, grace=grace)
        if cluster == "stuck":
            await asyncio.Event().wait()


async def test_losing_one_fence_blocks_nothing_else(fleet: Fleet) -> None:
    namespace = unique("stuck-shards")
    async with running_cluster(fleet["cluster-1"], "hub") as hub:
        await hub.client.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
        config = mcr.ShardingConfig(name="stuck", namespace=namespace, identity="me", **FAST)
        coordinator = mcr.ShardedCoordinator(config)
        seat = Seat(hub, ["stuck", "fine"], gate=StuckGate())
        async with coordinating(coordinator, seat):
            await wait_until(lambda: coordinator.owned == {"stuck", "fine"}, timeout=30)
            # Another writer takes the fence of "stuck" on the hub: this replica must stop there.
            fence = await hub.client.get(LEASE, config.fence_lease("stuck"), namespace=namespace)
            fence["spec"]["holderIdentity"] = "intruder"
            await hub.client.update(fence)
            await wait_until(lambda: "stuck" in seat.work.closing and "stuck" not in coordinator.owned)
            # Its close hangs; renewals and acquisitions go on regardless.
            peer = config.peer_lease("me")
            first = (await hub.client.get(LEASE, peer, namespace=namespace))["spec"]["renewTime"]

            async def renewed() -> bool:
                found = await hub.client.get(LEASE, peer, namespace=namespace)
                return bool(found["spec"]["renewTime"] != first)

            await wait_until(renewed, timeout=15)
            seat.names.add("late")
            await wait_until(lambda: coordinator.owned == {"fine", "late"}, timeout=20)
            # The fence is held first, then the gate opens for it: wait for that, not just the fence.
            await wait_until(lambda: seat.work.admits("late"), timeout=20)
            assert seat.work.admits("fine") and not seat.work.admits("stuck")


class FailingGate(WorkGate):
    """A gate whose close of ``broken`` fails (a controller's release that raised)."""

    async def close(self, cluster: str, *, grace: float = 0.0) -> None:
        await super().close(cluster, grace=grace)
        if cluster == "broken":
            raise RuntimeError("the release of 'broken' failed (test)")


async def test_a_close_that_fails_is_logged_when_it_fails_and_the_rest_goes_on(
    fleet: Fleet, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, "mcruntime.tasks")
    namespace = unique("failing-close")
    async with running_cluster(fleet["cluster-1"], "hub") as hub:
        await hub.client.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
        config = mcr.ShardingConfig(name="failing", namespace=namespace, identity="me", **FAST)
        coordinator = mcr.ShardedCoordinator(config)
        seat = Seat(hub, ["broken", "fine"], gate=FailingGate(list))
        async with coordinating(coordinator, seat):
            await wait_until(lambda: coordinator.owned == {"broken", "fine"}, timeout=30)
            fence = await hub.client.get(LEASE, config.fence_lease("broken"), namespace=namespace)
            fence["spec"]["holderIdentity"] = "intruder"
            await hub.client.update(fence)
            shard = config.shard_of("broken")

            def named() -> bool:
                return any(
                    f"close shard {shard} failed" in record.getMessage()
                    and "failed (test)" in str(record.exc_info and record.exc_info[1])
                    for record in caplog.records
                )

            await wait_until(named, timeout=20)
            assert "broken" not in coordinator.owned
            assert seat.work.admits("fine")


async def test_a_dead_watchdog_shows_in_the_managers_health(fleet: Fleet) -> None:
    namespace = unique("dead-watchdog")
    async with running_cluster(fleet["cluster-1"], "hub") as hub:
        await hub.client.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
        config = mcr.ShardingConfig(name="watched", namespace=namespace, identity="me", **FAST)
        coordinator = mcr.ShardedCoordinator(config, backoff=LongBackoff())

        async def dies() -> None:
            raise RuntimeError("watchdog broke (test)")

        coordinator._watchdog = dies  # type: ignore[method-assign]
        manager = mcr.Manager(local=hub.config, coordinator=coordinator, handle_signals=False)
        assert manager._loops_alive() is None
        seat = Seat(hub, ["x"])
        async with coordinating(coordinator, seat):
            await wait_until(lambda: coordinator.failing() != [], timeout=10)
            line = manager._loops_alive()
            assert line is not None
            assert "sharding watched: watchdog died (RuntimeError: watchdog broke (test))" in line
            assert seat.registry.get_sample_value("mcruntime_shard_loop_failures_total") == 1
            # The rounds go on meanwhile, and the write check still guards the work.
            await wait_until(lambda: coordinator.owned == {"x"}, timeout=30)


class LongBackoff(mcr.Backoff):
    """A backoff whose wait outlasts the test: a loop that died stays down while we look."""

    def delay(self, failures: int) -> float:
        return 3600.0


async def test_a_partitioned_replica_stops_within_the_renew_deadline_and_resumes(
    fleet: Fleet, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, "mcruntime.sharding")
    namespace = unique("cut-shards")
    async with running_cluster(fleet["cluster-1"], "hub") as hub:
        await hub.client.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
        real = hub.client
        link = Partition()
        hub.client = Partitionable(real, link)  # type: ignore[assignment]
        config = mcr.ShardingConfig(name="cut", namespace=namespace, identity="me", **FAST)
        coordinator = mcr.ShardedCoordinator(config)
        coordinator._liveness = liveness_through(hub, lambda client: Partitionable(client, link))
        seat = Seat(hub, ["x", "y"])
        try:
            async with coordinating(coordinator, seat):
                await wait_until(lambda: coordinator.owned == {"x", "y"}, timeout=30)
                fence = await real.get(LEASE, config.fence_lease("x"), namespace=namespace)
                link.cut = True
                await wait_until(lambda: not seat.work.opened and not coordinator.owned, timeout=30)
                # Stopped by its own renew deadline, which is shorter than the lease duration after
                # which another replica may take its fences: not by seeing them taken.
                assert f"could not renew its peer Lease within {config.renew_deadline:g}s" in caplog.text
                assert coordinator.metrics is not None
                assert seat.registry.get_sample_value("mcruntime_shard_fence_losses_total") == 2
                link.cut = False
                await wait_until(lambda: seat.work.opened == {"x", "y"}, timeout=15)
                again = await real.get(LEASE, config.fence_lease("x"), namespace=namespace)
                # Resumed through a fresh write of its fence, not by trusting the old one.
                assert again["metadata"]["resourceVersion"] != fence["metadata"]["resourceVersion"]
                assert again["spec"]["holderIdentity"] == "me"
        finally:
            hub.client = real


async def test_a_leader_renews_from_its_heartbeat_thread_while_its_event_loop_is_blocked(
    fleet: Fleet,
) -> None:
    """A reconciler that computes for longer than a retry period must not cost the leader its Lease."""
    async with running_cluster(fleet["cluster-1"], "busy-leader") as cluster:
        name = unique("busy-lease")
        elector = LeaderElector(mcr.LeaderElectionConfig(name=name, identity="busy", **FAST))
        task = asyncio.create_task(elector.run(cluster))
        try:
            await asyncio.wait_for(elector.leading.wait(), 20)
            await wait_until(lambda: elector.renewals >= 1, timeout=20)
            before = elector.renewals
            # Two retry periods without the loop turning (within the stall limit, the renew deadline).
            deadline = time.monotonic() + 2 * FAST["retry_period"]
            while time.monotonic() < deadline:
                time.sleep(0.01)  # noqa: ASYNC251 -- blocking the event loop is the point
            assert elector.renewals > before, "no renewal while the event loop was blocked"
            await asyncio.sleep(0)
            assert elector.leading.is_set()
            lease = await cluster.client.get(LEASE, name, namespace="default")
            assert lease["spec"]["holderIdentity"] == "busy"
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


async def test_a_leaders_stalled_event_loop_is_told_by_the_leader_elections_own_logger(
    fleet: Fleet, caplog: pytest.LogCaptureFixture
) -> None:
    # A filter on mcruntime.leaderelection must see why a leader stepped down.
    caplog.set_level(logging.WARNING, "mcruntime")
    async with running_cluster(fleet["cluster-1"], "stalled-leader") as cluster:
        name = unique("stalled-lease")
        elector = LeaderElector(mcr.LeaderElectionConfig(name=name, identity="stalled", **FAST))
        task = asyncio.create_task(elector.run(cluster))

        def stall_told() -> list[logging.LogRecord]:
            return [
                record for record in caplog.records if "the event loop has not turned" in record.getMessage()
            ]

        try:
            await asyncio.wait_for(elector.leading.wait(), 20)
            # The loop does not turn past the heartbeat's stall limit (the renew deadline).
            deadline = time.monotonic() + 5 * FAST["renew_deadline"]
            while not stall_told() and time.monotonic() < deadline:
                time.sleep(0.01)  # noqa: ASYNC251 -- blocking the event loop is the point
            told = stall_told()
            assert told, "no warning while the leader's event loop stalled"
            assert {record.name for record in told} == {"mcruntime.leaderelection"}
            assert "so this replica steps down and another may lead" in told[0].getMessage()
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


class InFlight:
    """The real hub client, counting its Lease writes in flight and the most at once."""

    def __init__(self, real: mcr.Client) -> None:
        self._real = real
        self.now = 0
        self.most = 0

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._real, name)
        if name not in ("create", "update", "delete"):
            return method

        async def call(*args: Any, **kwargs: Any) -> Any:
            self.now += 1
            self.most = max(self.most, self.now)
            try:
                return await method(*args, **kwargs)
            finally:
                self.now -= 1

        return call


async def test_handing_over_many_clusters_at_once_bounds_the_writes_to_the_hub(fleet: Fleet) -> None:
    # At 10,000 clusters going from three replicas to four, each old replica handed over
    # about 830 clusters at once (before fences were per shard): that many writes and new
    # connections to the hub at once, answered too late for all of them. Releases wait for
    # a turn, like acquisitions: here 120 clusters in 95 shards leave at once.
    from mcruntime._coordination.shardhub import CONCURRENT_WRITES

    namespace = unique("many-shards")
    names = [f"m{index:03d}" for index in range(120)]
    async with running_cluster(fleet["cluster-1"], "hub") as hub:
        await hub.client.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
        real = hub.client
        counting = InFlight(real)
        hub.client = counting  # type: ignore[assignment]
        config = mcr.ShardingConfig(name="many", namespace=namespace, identity="me", **FAST)
        coordinator = mcr.ShardedCoordinator(config)
        seat = Seat(hub, names)
        shards = {config.shard_of(name) for name in names}
        assert len(shards) > 4 * CONCURRENT_WRITES
        try:
            async with coordinating(coordinator, seat):
                await wait_until(lambda: coordinator.owned == set(names), timeout=60, what="all fences held")
                released = coordinator.metrics.fence_releases if coordinator.metrics else None
                assert released is not None
                seat.names.clear()  # every cluster leaves the fleet at once: every fence goes
                await wait_until(
                    lambda: released._value.get() == len(shards), timeout=60, what="every fence handed over"
                )
                assert not coordinator.owned
        finally:
            hub.client = real
        assert 1 < counting.most <= CONCURRENT_WRITES, counting.most
        leases = await real.list(LEASE, namespace=namespace)
        assert not [item for item in leases.items if "-fence-" in item["metadata"]["name"]]


async def test_a_peer_that_counts_other_shards_stops_both_and_says_why(
    fleet: Fleet, caplog: pytest.LogCaptureFixture
) -> None:
    # Two shard counts split the fleet into fences of different names: neither would fence
    # the other off a cluster. So while they disagree, neither holds anything, and says why.
    caplog.set_level(logging.INFO, "mcruntime.sharding")
    namespace = unique("disagree")
    names = ["", "x", "y"]
    async with running_cluster(fleet["cluster-1"], "hub") as hub:
        await hub.client.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})

        def coordinator(identity: str, shards: int) -> mcr.ShardedCoordinator:
            config = mcr.ShardingConfig(
                name="disagree", namespace=namespace, identity=identity, shards=shards, **FAST
            )
            return mcr.ShardedCoordinator(config)

        ours, seat = coordinator("ours", 256), Seat(hub, names)
        async with coordinating(ours, seat):
            await wait_until(lambda: ours.owned == set(names) and seat.work.opened == set(names), timeout=30)
            theirs, their_seat = coordinator("theirs", 128), Seat(hub, names)
            async with coordinating(theirs, their_seat):
                await wait_until(lambda: not ours._fences.held and not seat.work.opened, timeout=30)
                assert "peer 'theirs' announces 128 shards; this replica counts 256 shards" in caplog.text
                said = "peer 'ours' announces 256 shards; this replica counts 128 shards"
                await wait_until(lambda: said in caplog.text, timeout=10)
                assert not theirs._fences.held and not their_seat.work.opened
                leases = await hub.client.list(LEASE, namespace=namespace)
                assert {
                    item["metadata"]["name"] for item in leases.items if item["spec"].get("holderIdentity")
                } == {ours.config.peer_lease("ours"), theirs.config.peer_lease("theirs")}
            # The other count withdrew its peer Lease on stopping: ours takes everything back.
            await wait_until(lambda: ours.owned == set(names) and seat.work.opened == set(names), timeout=30)
            assert "every live peer now counts 256 shards" in caplog.text


async def test_a_cluster_that_leaves_stops_alone_and_its_shard_fence_goes_with_the_last(fleet: Fleet) -> None:
    namespace = unique("leaving")
    async with running_cluster(fleet["cluster-1"], "hub") as hub:
        await hub.client.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
        config = mcr.ShardingConfig(name="leaving", namespace=namespace, identity="me", **FAST)
        partner = next(
            name
            for name in (f"p{index}" for index in range(10_000))
            if config.shard_of(name) == config.shard_of("x")
        )
        coordinator = mcr.ShardedCoordinator(config)
        seat = Seat(hub, ["", "x", partner])
        async with coordinating(coordinator, seat):
            await wait_until(lambda: seat.work.opened == {"", "x", partner}, timeout=30)
            assert coordinator.metrics is not None
            acquired = coordinator.metrics.fence_acquisitions._value.get()
            assert acquired == 2  # two shards: the hub's, and the one "x" and its partner share
            seat.names.discard(partner)  # it leaves the fleet; its shard stays ours for "x"
            await wait_until(lambda: seat.work.opened == {"", "x"}, timeout=30)
            assert coordinator.owned == {"", "x"}
            fence = await hub.client.get(LEASE, config.fence_lease("x"), namespace=namespace)
            assert fence["spec"]["holderIdentity"] == "me"
            assert coordinator.metrics.fence_releases._value.get() == 0
            seat.names.add(partner)  # it comes back: its shard is still ours, so its work reopens
            await wait_until(lambda: seat.work.opened == {"", "x", partner}, timeout=30)
            seat.names -= {partner, "x"}  # the last of its shard: the fence goes with them

            async def fence_gone() -> bool:
                leases = await hub.client.list(LEASE, namespace=namespace)
                return config.fence_lease("x") not in {item["metadata"]["name"] for item in leases.items}

            await wait_until(fence_gone, timeout=30)
            assert seat.work.opened == {""}
            assert coordinator.metrics.fence_acquisitions._value.get() == acquired


async def test_after_the_hub_was_gone_for_everyone_no_replica_takes_a_live_peers_fences(
    fleet: Fleet,
) -> None:
    # Both replicas lose the hub for longer than a lease: each saw the other silent, but
    # only because it could hear nothing itself. Back, neither may take the other's fences.
    namespace = unique("outage")
    clusters = [f"c{index}" for index in range(8)]
    link = Partition()
    async with (
        running_cluster(fleet["cluster-1"], "hub-a") as hub_a,
        running_cluster(fleet["cluster-1"], "hub-b") as hub_b,
    ):
        await hub_a.client.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
        coordinators, seats, reals = [], [], []
        for identity, hub in (("a", hub_a), ("b", hub_b)):
            reals.append(hub.client)
            hub.client = Partitionable(hub.client, link)  # type: ignore[assignment]
            config = mcr.ShardingConfig(
                name="outage", namespace=namespace, identity=identity, shards=8, **FAST
            )
            coordinator = mcr.ShardedCoordinator(config)
            coordinator._liveness = liveness_through(hub, lambda client: Partitionable(client, link))
            coordinators.append(coordinator)
            seats.append(Seat(hub, clusters))
        a, b = coordinators
        try:
            async with coordinating(a, seats[0]), coordinating(b, seats[1]):

                def split() -> bool:
                    return a.owned | b.owned == set(clusters) and not a.owned & b.owned and bool(a.owned)

                await wait_until(lambda: split() and len(a.peers()) == 2 and len(b.peers()) == 2, timeout=30)
                await wait_until(lambda: split() and seats[0].work.opened == a.owned, timeout=30)
                before = (set(a.owned), set(b.owned))
                link.cut = True
                await wait_until(lambda: not a.owned and not b.owned, timeout=30)
                losses = [
                    seat.registry.get_sample_value("mcruntime_shard_fence_losses_total") for seat in seats
                ]
                # Longer than a lease: each has seen the other silent for a full term.
                outage = asyncio.get_running_loop().create_future()
                asyncio.get_running_loop().call_later(FAST["lease_duration"] * 1.5, outage.set_result, None)
                await outage
                link.cut = False
                await wait_until(lambda: (set(a.owned), set(b.owned)) == before, timeout=30)
                await wait_until(lambda: seats[0].work.opened == before[0], timeout=30)
                after = [
                    seat.registry.get_sample_value("mcruntime_shard_fence_losses_total") for seat in seats
                ]
                assert after == losses, f"fences changed hands after the outage: {losses} -> {after}"
        finally:
            for hub, real in zip((hub_a, hub_b), reals, strict=True):
                hub.client = real
