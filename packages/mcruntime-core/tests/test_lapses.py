"""A replica whose share or leadership lapsed writes nothing more, however late its loop runs.

Found by CI at 1,000 clusters on two loaded cores: a replica wrote a cluster
after another had taken it over, while both lived. Stopping work was only the
watchdog's task, and on a loop running late a reconcile that is ready at the
same moment goes first; a renewal that finally succeeds after the deadline
then made the share look good again. These tests stall a real replica's event
loop (the fault under test) while its link to the hub is cut, and check that
once the loop turns again nothing is written until the fences are retaken.
A leader has the same hazard: stepping down is a task of its loop, and a
renewal that lands late must end its term rather than extend it.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from kube_helpers import new_namespace, running_cluster, unique
from lease_helpers import Partition, Partitionable, liveness_through

import mcruntime as mcr
from mcruntime._reconcile.fence import enter_write_check, leave_write_check
from mcruntime.coordination import Fenced, LeaderElector
from mcruntime.testing import Fleet, wait_until

CONFIGMAP = mcr.Kind("v1", "ConfigMap")
LEASE = mcr.Kind("coordination.k8s.io/v1", "Lease")
# A stall limit (lease_duration) well above the renew deadline: the stalled loop below
# outlasts the deadline, and the heartbeat still renews once the link is back.
TIMING: Any = {"lease_duration": 8.0, "renew_deadline": 2.0, "retry_period": 0.5}


async def namespace_with_x(cluster: mcr.Cluster, prefix: str) -> tuple[str, dict[str, Any]]:
    """A namespace of the test's own holding one empty ConfigMap ``x``, and that ConfigMap."""
    namespace = await new_namespace(cluster, prefix)
    created = await cluster.client.create(
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x", "namespace": namespace}}
    )
    return namespace, created


@contextlib.asynccontextmanager
async def hub_and_member(
    fleet: Fleet, prefix: str
) -> AsyncIterator[tuple[mcr.Cluster, mcr.Cluster, str, str]]:
    """The hub (cluster-1) with a namespace for the Leases; the member (cluster-2) with one holding ``x``."""
    hub_namespace, namespace = unique(f"{prefix}-hub"), unique(prefix)
    async with (
        running_cluster(fleet["cluster-1"], "hub") as hub,
        running_cluster(fleet["cluster-2"], "member") as member,
    ):
        await hub.client.create(
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": hub_namespace}}
        )
        await member.client.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
        await member.client.create(
            {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x", "namespace": namespace}}
        )
        yield hub, member, hub_namespace, namespace


def member_manager(
    fleet: Fleet,
    coordinator: mcr.ShardedCoordinator,
    namespace: str,
    reconcile: Callable[[mcr.Request], Awaitable[None]],
) -> mcr.Manager:
    """A sharded replica over one member cluster ``m`` (cluster-2, hub cluster-1) reconciling its ConfigMaps."""
    manager = mcr.Manager(
        mcr.StaticProvider({"m": mcr.kubeconfig_from_dict(fleet["cluster-2"].kubeconfig())}),
        local=mcr.kubeconfig_from_dict(fleet["cluster-1"].kubeconfig()),
        coordinator=coordinator,
        handle_signals=False,
    )
    (
        mcr.controller_managed_by(manager)
        .for_(CONFIGMAP, namespace=namespace, clusters=mcr.PROVIDER_ONLY)
        .complete(reconcile)
    )
    return manager


async def write_as_me(cluster: mcr.Cluster, current: dict[str, Any], outcomes: list[object]) -> None:
    """Stamp ``current`` as written by "me"; ``outcomes`` gets "written" or the error."""
    try:
        await cluster.client.update({**current, "data": {"writer": "me"}})
    except BaseException as error:
        outcomes.append(error)
        raise
    outcomes.append("written")


async def holding(entered: asyncio.Event, hub: mcr.Cluster, config: mcr.ShardingConfig) -> Any:
    """Once the first reconcile holds: ``m``'s fence as the hub has it."""
    await asyncio.wait_for(entered.wait(), 60)
    return await hub.client.get(LEASE, config.shard_fence(config.shard_of("m")), namespace=config.namespace)


async def test_a_write_in_a_guarded_task_is_refused_before_it_is_sent_and_reads_go_on(fleet: Fleet) -> None:
    async with running_cluster(fleet["cluster-2"], "guarded") as cluster:
        namespace, created = await namespace_with_x(cluster, "guarded")
        refusal: list[str | None] = [None]
        token = enter_write_check(lambda: refusal[0])
        try:
            changed = {**created, "data": {"a": "1"}}
            written = await cluster.client.update(changed)  # no reason yet: it goes
            refusal[0] = "shard group 'g': this replica's share lapsed"
            with pytest.raises(Fenced) as caught:
                await cluster.client.update({**written, "data": {"a": "2"}})
            assert caught.value.cluster == "guarded"
            assert "not sending PUT" in str(caught.value) and "share lapsed" in str(caught.value)
            with pytest.raises(Fenced):
                await cluster.client.delete(CONFIGMAP, "x", namespace=namespace)
            # Reads race nobody: they are still sent.
            current = await cluster.client.get(CONFIGMAP, "x", namespace=namespace)
        finally:
            leave_write_check(token)
        assert current["data"] == {"a": "1"}
        assert current["metadata"]["resourceVersion"] == written["metadata"]["resourceVersion"]
        # Outside the guarded task the same client writes as ever.
        await cluster.client.update({**current, "data": {"a": "3"}})


async def test_a_stalled_replica_whose_renewal_came_late_writes_nothing_until_it_retakes_its_fences(
    fleet: Fleet,
) -> None:
    async with hub_and_member(fleet, "lapse") as (hub, member, hub_namespace, namespace):
        config = mcr.ShardingConfig(name="lapse", namespace=hub_namespace, identity="me", **TIMING)
        coordinator = mcr.ShardedCoordinator(config)
        link = Partition()
        coordinator._liveness = liveness_through(hub, lambda client: Partitionable(client, link))
        entered, release = asyncio.Event(), asyncio.Event()
        outcomes: list[object] = []

        async def reconcile(request: mcr.Request) -> None:
            cluster = await manager.get_cluster(request.cluster)
            current = await cluster.client.get(CONFIGMAP, request.name, namespace=request.namespace)
            if not outcomes:  # the first reconcile holds, having read, until the test lets it write
                entered.set()
                await release.wait()
            if current.get("data") == {"writer": "me"}:
                return  # our own write's event
            await write_as_me(cluster, current, outcomes)

        manager = member_manager(fleet, coordinator, namespace, reconcile)
        runner = asyncio.create_task(manager.start())
        try:
            fence = await holding(entered, hub, config)
            # The fault: the link to the hub is cut and the event loop stalls past the renew
            # deadline, so the watchdog cannot run. Then the link comes back and the heartbeat's
            # thread renews (late) while the loop is still stalled.
            link.cut = True
            stall_until = time.monotonic() + config.renew_deadline + 0.5
            while time.monotonic() < stall_until:
                time.sleep(0.01)  # noqa: ASYNC251 -- blocking the event loop is the fault
            # The last renewal that went through: one in flight at the cut may have landed since.
            renewed = coordinator._members.renewed_at
            assert renewed is not None
            link.cut = False
            give_up = time.monotonic() + config.lease_duration - config.renew_deadline - 1.0
            while coordinator._members.renewed_at == renewed and time.monotonic() < give_up:
                time.sleep(0.01)  # noqa: ASYNC251 -- still the stall; waiting on the thread's renewal
            late = coordinator._members.renewed_at
            assert late is not None and late != renewed, "the heartbeat did not renew once the link was back"
            assert late - renewed >= config.renew_deadline
            # The renewal is fresh, but the share lapsed in between: no write may go out of it.
            assert manager.work.refusal() is not None
            assert not manager.work.admits("m")
            release.set()
            await wait_until(lambda: len(outcomes) >= 1, timeout=10)
            first = outcomes[0]
            # Its write was refused before it was sent (or the watchdog cancelled it first).
            assert isinstance(first, Fenced | asyncio.CancelledError), first
            if isinstance(first, Fenced):
                assert "Fenced: not sending PUT" in str(first), first
                assert "'lapse'" in str(first) and "unrenewed" in str(first), first
            # Then it takes its fence back through a fresh write, and only then works again.
            await wait_until(lambda: "written" in outcomes, timeout=30)
            again = await hub.client.get(LEASE, fence["metadata"]["name"], namespace=hub_namespace)
            assert again["metadata"]["resourceVersion"] != fence["metadata"]["resourceVersion"]
            assert again["spec"]["holderIdentity"] == "me"
            current = await member.client.get(CONFIGMAP, "x", namespace=namespace)
            assert current["data"] == {"writer": "me"}
            assert outcomes.count("written") == 1
            # Every shard it held was dropped: m's and the hub's own ("" is sharded too).
            held = len({config.shard_of("m"), config.shard_of(mcr.LOCAL_CLUSTER)})
            assert manager.registry.get_sample_value("mcruntime_shard_fence_losses_total") == held
            controller = manager.controllers["configmap"]
            assert controller.stats.fenced == (1 if isinstance(first, Fenced) else 0)
        finally:
            release.set()
            manager.stop()
            with contextlib.suppress(asyncio.CancelledError):
                await runner


class HeldRenewals:
    """The leader's heartbeat client; while ``held`` is clear, its Lease updates wait (on the heartbeat's thread)."""

    def __init__(self, real: mcr.Client, held: threading.Event) -> None:
        self._real = real
        self._held = held

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._real, name)
        if name != "update":
            return method

        async def call(*args: Any, **kwargs: Any) -> Any:
            await asyncio.to_thread(self._held.wait)  # the injected slowness, off the heartbeat's loop
            return await method(*args, **kwargs)

        return call


async def test_a_leader_whose_renewal_landed_late_steps_down_and_its_reconciles_write_nothing(
    fleet: Fleet,
) -> None:
    # renew 3 s, retry 0.5 s: the leader gives up 2.5 s after a renewal; a renewal may take 1.5 s.
    timing: Any = {"lease_duration": 8.0, "renew_deadline": 3.0, "retry_period": 0.5}
    async with running_cluster(fleet["cluster-1"], "leader") as cluster:
        namespace, created = await namespace_with_x(cluster, "leader-lapse")
        elector = LeaderElector(mcr.LeaderElectionConfig(name=unique("lapse"), identity="me", **timing))
        flowing = threading.Event()
        flowing.set()
        elector._liveness = liveness_through(cluster, lambda client: HeldRenewals(client, flowing))
        task = asyncio.create_task(elector.run(cluster))
        try:
            await asyncio.wait_for(elector.leading.wait(), 20)
            await wait_until(lambda: elector.renewals >= 1, timeout=20)
            assert elector.refusal() is None
            term = elector._lost  # set when this term ends
            # The fault: renewals hang and the event loop stalls, so the leader cannot step down
            # when it should; then a renewal lands, late, while the loop is still stalled.
            flowing.clear()
            held_at = time.monotonic()
            give_up = timing["renew_deadline"] - timing["retry_period"]
            while time.monotonic() < held_at + give_up + 0.05:
                time.sleep(0.01)  # noqa: ASYNC251 -- blocking the event loop is the fault
            # The last renewal that went through: one in flight when they were held may have landed.
            renewed = elector._renewed_at
            flowing.set()
            limit = held_at + timing["renew_deadline"] - 0.1  # the heartbeat stops at the stall limit
            while elector._renewed_at == renewed and time.monotonic() < limit:
                time.sleep(0.01)  # noqa: ASYNC251 -- still the stall; waiting on the thread's renewal
            assert elector._renewed_at != renewed, "no renewal landed while the loop was stalled"
            assert elector.leading.is_set()  # the loop has not had a turn to step down
            reason = elector.refusal()
            assert reason is not None and "after the renew deadline" in reason
            token = enter_write_check(elector.refusal)
            try:
                with pytest.raises(Fenced, match="not sending PUT"):
                    await cluster.client.update({**created, "data": {"by": "late leader"}})
            finally:
                leave_write_check(token)
            # It steps down at its loop's next turn, then leads again through a fresh acquisition.
            await asyncio.wait_for(term.wait(), 5)
            await asyncio.wait_for(elector.leading.wait(), 20)
            assert elector.refusal() is None
            current = await cluster.client.get(CONFIGMAP, "x", namespace=namespace)
            assert not current.get("data")
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


async def test_a_reconcile_that_outlives_its_lost_shard_writes_nothing(fleet: Fleet) -> None:
    """Found by CI at 1,000 clusters: a replica wrote a cluster after losing its shard, before its close ran.

    Losing a shard (its fence taken, or the share lapsed and then renewed)
    closes the shard's clusters in a task; a reconcile that is ready first, or
    that swallows its cancellation, used to write as if nothing had happened.
    Here another holder takes the fence on the hub while a reconcile holds
    after its read, and that reconcile ignores the cancel and writes.
    """
    async with hub_and_member(fleet, "takeover") as (hub, member, hub_namespace, namespace):
        config = mcr.ShardingConfig(name="takeover", namespace=hub_namespace, identity="me", **TIMING)
        coordinator = mcr.ShardedCoordinator(config)
        entered, release = asyncio.Event(), asyncio.Event()
        outcomes: list[object] = []

        async def reconcile(request: mcr.Request) -> None:
            cluster = await manager.get_cluster(request.cluster)
            current = await cluster.client.get(CONFIGMAP, request.name, namespace=request.namespace)
            if outcomes:
                return
            entered.set()
            try:
                await release.wait()
            except asyncio.CancelledError:
                outcomes.append("cancel swallowed")  # the reconcile under test goes on regardless
            await write_as_me(cluster, current, outcomes)

        manager = member_manager(fleet, coordinator, namespace, reconcile)
        runner = asyncio.create_task(manager.start())
        try:
            fence = await holding(entered, hub, config)
            assert fence["spec"]["holderIdentity"] == "me"
            # The fault: another holder's name on the fence, as a replica that judged us dead would write.
            await hub.client.update({**fence, "spec": {**fence["spec"], "holderIdentity": "intruder"}})
            await wait_until(lambda: len(outcomes) >= 2, timeout=30, what="the reconcile tried its write")
            assert outcomes[0] == "cancel swallowed", outcomes
            refused = outcomes[1]
            assert isinstance(refused, Fenced), refused
            assert "not sending PUT" in str(refused) and "cluster 'm'" in str(refused), refused
            assert "lost shard" in str(refused) and "held by intruder" in str(refused), refused
            current = await member.client.get(CONFIGMAP, "x", namespace=namespace)
            assert not current.get("data")
            # Its reconcile over, the cluster's close ends and leaves no mark behind.
            await wait_until(lambda: not manager.work._cuts, timeout=10, what="the close lifted the cut")
            assert not manager.work.admits("m")
            assert manager.controllers["configmap"].stats.fenced == 1
        finally:
            release.set()
            manager.stop()
            with contextlib.suppress(asyncio.CancelledError):
                await runner
