"""Cross-cluster ownership and cleanup on real control planes, one of them hung.

A Widget on the hub (cluster-1) owns a ConfigMap in the hub, in a member
(cluster-2) and in a fresh cluster that is stopped with SIGSTOP (it hangs; it
does not refuse) while the Widget is deleted. The finalizer must stay on
while that cluster is away, the pending cluster must be named (result, log,
condition), and only after the cluster resumes and its child is deleted may
the Widget go.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import pytest
from kube_helpers import CONFIGMAP, configmap, hung, install_widget_crd, running_cluster, unique

import mcruntime as mcr
from mcruntime import toolkit
from mcruntime.testing import ControlPlane, Fleet, running, wait_until

# When the suite runs in parallel, no other test runs beside this module's:
# it times how soon a deleted or resumed cluster is released.
pytestmark = pytest.mark.alone

FINALIZER = "toolkit.test.mcruntime.dev/children"
HUB = mcr.LOCAL_CLUSTER


def config_of(plane: ControlPlane) -> mcr.ClusterConfig:
    return mcr.kubeconfig_from_dict(plane.kubeconfig())


class WidgetFanout:
    """A Widget on the hub gets a ConfigMap of its name in every engaged cluster; deletion cleans up."""

    def __init__(self, manager: mcr.Manager, widget: mcr.Kind, namespace: str) -> None:
        self.manager = manager
        self.widget = widget
        self.namespace = namespace
        self.cleanup = toolkit.ChildCleanup(
            manager.clusters,
            FINALIZER,
            [CONFIGMAP],
            backoff=mcr.Backoff(base=0.2, cap=1.0),
            attempt_timeout=3.0,
        )
        self.results: list[toolkit.CleanupResult] = []
        mcr.controller_managed_by(manager).named("widget-fanout").for_(
            widget, clusters=mcr.LOCAL_ONLY, namespace=namespace
        ).watches(
            CONFIGMAP,
            toolkit.enqueue_for_cluster_owner(widget),
            clusters=mcr.EVERY_CLUSTER,
            namespace=namespace,
            label_selector=toolkit.owned_by_kind_selector(widget),
        ).complete(self.reconcile)

    async def reconcile(self, request: mcr.Request) -> mcr.Result | None:
        hub = await self.manager.get_cluster(HUB)
        owner = await hub.cache.get_or_none(self.widget, request.name, namespace=request.namespace)
        if owner is None:
            return None
        if owner["metadata"].get("deletionTimestamp"):
            result = await self.cleanup.finalize(HUB, owner)
            self.results.append(result)
            return result.result()
        owner = await toolkit.add_finalizer(hub.client, owner, FINALIZER)

        def mutate(child: dict[str, Any]) -> None:
            toolkit.set_cluster_owner(child, HUB, owner)

        for cluster in self.manager.clusters().values():
            await toolkit.create_or_patch(cluster.client, configmap(request.name, request.namespace), mutate)
        return None


async def child_in(plane: ControlPlane, namespace: str, name: str) -> dict[str, Any] | None:
    async with running_cluster(plane) as cluster:
        return await cluster.client.get_or_none(CONFIGMAP, name, namespace=namespace)


async def test_a_hung_cluster_holds_the_owners_finalizer_until_it_returns_and_its_child_is_deleted(
    fleet: Fleet, fresh_cluster: ControlPlane, caplog: pytest.LogCaptureFixture
) -> None:
    planes = {"hub": fleet["cluster-1"], "member": fleet["cluster-2"], "away": fresh_cluster}
    namespace = unique("xown")
    async with running_cluster(planes["hub"]) as admin:
        widget = await install_widget_crd(admin)
    for plane in planes.values():
        async with running_cluster(plane) as admin:
            await admin.client.create(
                {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}
            )
    # Probes every second: the hang is noticed within 2 s, and later passes fail fast on the
    # open circuit instead of waiting out the silent server.
    options = mcr.ClusterOptions(health_probe_interval=1.0, health_probe_timeout=1.0)
    provider = mcr.StaticProvider(
        {"member": config_of(planes["member"]), "away": config_of(planes["away"])}, options=options
    )
    manager = mcr.Manager(provider, local=config_of(planes["hub"]), handle_signals=False)
    fanout = WidgetFanout(manager, widget, namespace)
    async with running(manager), running_cluster(planes["hub"]) as hub:
        await wait_until(lambda: set(manager.clusters()) == {HUB, "member", "away"})
        created = await hub.client.create(
            {
                "apiVersion": widget.api_version,
                "kind": "Widget",
                "metadata": {"name": "w", "namespace": namespace},
            }
        )
        uid = created["metadata"]["uid"]

        async def children_everywhere() -> bool:
            found = [await child_in(plane, namespace, "w") for plane in planes.values()]
            return all(child is not None and toolkit.cluster_owner_of(child) is not None for child in found)

        await wait_until(children_everywhere, timeout=30)
        away_child = await child_in(planes["away"], namespace, "w")
        assert away_child is not None
        assert toolkit.cluster_owner_of(away_child) == toolkit.ClusterOwner(
            HUB, widget.api_version, "Widget", namespace, "w", uid
        )
        assert away_child["metadata"]["labels"][toolkit.OWNER_UID_LABEL] == uid

        # The handler maps a member's child to the hub's Widget: a child deleted there comes back.
        async with running_cluster(planes["member"]) as member:
            await member.client.delete(CONFIGMAP, "w", namespace=namespace)
        await wait_until(lambda: child_in(planes["member"], namespace, "w"), timeout=30)

        with hung(planes["away"]), caplog.at_level(logging.WARNING, logger="mcruntime.toolkit"):
            await hub.client.delete(widget, "w", namespace=namespace)
            deleted_at = time.monotonic()

            async def held_after_the_circuit_opened() -> bool:
                reasons = [result.pending.get("away", "") for result in fanout.results]
                return len(reasons) >= 2 and reasons[-1].startswith("Unreachable")

            await wait_until(held_after_the_circuit_opened, timeout=30)
            assert all(not result.released for result in fanout.results)
            assert {tuple(result.pending) for result in fanout.results} == {("away",)}
            first = fanout.results[0]
            assert first.deleted == {HUB: 1, "member": 1}  # the reachable clusters were cleaned at once
            assert first.requeue_after is not None and first.requeue_after <= 1.0
            # The Widget waits, finalizer on, and says why on its status and in the log.
            held = await hub.client.get(widget, "w", namespace=namespace)
            assert held["metadata"]["deletionTimestamp"] and FINALIZER in held["metadata"]["finalizers"]

            async def condition_written() -> bool:
                current = await hub.client.get(widget, "w", namespace=namespace)
                return toolkit.find_status_condition(current, "ChildrenDeleted") is not None

            await wait_until(condition_written, timeout=10)
            condition = toolkit.find_status_condition(
                await hub.client.get(widget, "w", namespace=namespace), "ChildrenDeleted"
            )
            assert condition is not None
            assert (condition["status"], condition["reason"]) == ("False", "ClustersPending")
            assert condition["message"] == f"finalizer {FINALIZER} kept until children are deleted in 'away'"
            assert "finalizer toolkit.test.mcruntime.dev/children is kept" in caplog.text
            assert "'away'" in caplog.text
            assert await child_in(planes["hub"], namespace, "w") is None
            assert await child_in(planes["member"], namespace, "w") is None
            held_passes = len(fanout.results)
            hung_for = time.monotonic() - deleted_at
        resumed_at = time.monotonic()

        # Resumed: the next pass deletes the child there, and only then releases the Widget.
        async def widget_gone() -> bool:
            return await hub.client.get_or_none(widget, "w", namespace=namespace) is None

        await wait_until(widget_gone, timeout=60)
        release_after_resume = time.monotonic() - resumed_at
        assert await child_in(planes["away"], namespace, "w") is None
        released = [index for index, result in enumerate(fanout.results) if result.released]
        assert released, "the Widget went without a pass that released it"
        last_held = max(index for index, result in enumerate(fanout.results) if not result.released)
        assert last_held >= held_passes - 1 and released[0] == last_held + 1
        assert fanout.results[released[0]].pending == {}
        print(
            f"{len(fanout.results)} cleanup passes, {released[0]} held; owner held {hung_for:.1f}s while "
            f"hung, released {release_after_resume:.1f}s after SIGCONT"
        )


async def test_orphans_in_a_returning_cluster_are_found_by_their_owner_record(fleet: Fleet) -> None:
    planes = {"hub": fleet["cluster-1"], "member": fleet["cluster-2"]}
    namespace = unique("orphan")
    for plane in planes.values():
        async with running_cluster(plane) as admin:
            await admin.client.create(
                {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}
            )
    async with (
        running_cluster(planes["hub"], "") as hub,
        running_cluster(planes["member"], "member") as member,
    ):
        live = await hub.client.create(configmap("live", namespace))
        dead = await hub.client.create(configmap("dead", namespace))
        for owner in (live, dead):
            child = configmap(f"child-of-{owner['metadata']['name']}", namespace)
            toolkit.set_cluster_owner(child, HUB, owner)
            await member.client.create(child)
        await hub.client.delete(CONFIGMAP, "dead", namespace=namespace)
        # An object of the dead owner's name, created since, is another owner: its uid differs.
        await hub.client.create(configmap("dead", namespace))
        cleanup = toolkit.ChildCleanup(lambda: {HUB: hub, "member": member}, FINALIZER, [CONFIGMAP])
        assert await cleanup.delete_orphans("member", CONFIGMAP) == 1
        assert await member.client.get_or_none(CONFIGMAP, "child-of-dead", namespace=namespace) is None
        assert await member.client.get_or_none(CONFIGMAP, "child-of-live", namespace=namespace) is not None
        assert await cleanup.delete_orphans("member", CONFIGMAP) == 0


async def test_a_pending_cluster_that_leaves_the_fleet_is_not_waited_for_and_the_release_says_so(
    fleet: Fleet, caplog: pytest.LogCaptureFixture
) -> None:
    namespace = unique("left")
    # A cluster nobody answers for: its server's port is closed, so every request fails.
    kubeconfig = fleet["cluster-1"].kubeconfig()
    kubeconfig["clusters"][0]["cluster"]["server"] = "https://127.0.0.1:9"
    async with (
        running_cluster(fleet["cluster-1"], HUB) as hub,
        mcr.Cluster("gone", mcr.kubeconfig_from_dict(kubeconfig)) as gone,
    ):
        await hub.client.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
        owner = await hub.client.create(configmap("owner", namespace))
        owner = await toolkit.add_finalizer(hub.client, owner, FINALIZER)
        await hub.client.delete(CONFIGMAP, "owner", namespace=namespace)
        owner = await hub.client.get(CONFIGMAP, "owner", namespace=namespace)
        fleet_now: dict[str, mcr.Cluster] = {HUB: hub, "gone": gone}
        cleanup = toolkit.ChildCleanup(
            lambda: fleet_now, FINALIZER, [CONFIGMAP], backoff=mcr.Backoff(base=0, cap=0), attempt_timeout=2.0
        )
        held = await cleanup.finalize(HUB, owner)
        assert not held.released and list(held.pending) == ["gone"] and held.left_fleet == ()
        assert held.result() == mcr.Result(requeue_after=0.0)
        assert await hub.client.get_or_none(CONFIGMAP, "owner", namespace=namespace) is not None

        del fleet_now["gone"]  # the provider disengaged it
        with caplog.at_level(logging.WARNING, logger="mcruntime.toolkit"):
            released = await cleanup.finalize(HUB, owner)
        assert released.released and released.left_fleet == ("gone",) and released.result() is None
        assert "released without deleting the children in 'gone'" in caplog.text
        assert await hub.client.get_or_none(CONFIGMAP, "owner", namespace=namespace) is None
