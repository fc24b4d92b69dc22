"""One reconciler, many clusters, clusters coming and going while it runs (real control planes)."""

from __future__ import annotations

import asyncio
import contextlib
from collections import defaultdict

import pytest
from kube_helpers import CONFIGMAP, configmap, unique

import mcruntime as mcr
from mcruntime.testing import ControlPlane, Fleet, running, wait_until
from mcruntime.workqueue import ExponentialBackoff


def config_of(plane: ControlPlane) -> mcr.ClusterConfig:
    return mcr.kubeconfig_from_dict(plane.kubeconfig())


class Seen:
    """What a uniform reconciler saw: (cluster, namespace, name) -> the value it read."""

    def __init__(self) -> None:
        self.objects: dict[tuple[str, str, str], str | None] = {}
        self.calls: defaultdict[str, int] = defaultdict(int)

    def clusters_with(self, namespace: str) -> set[str]:
        return {cluster for cluster, ns, _name in self.objects if ns == namespace}


def uniform_reconciler(manager: mcr.Manager, seen: Seen) -> mcr.ReconcileFunction:
    """A reconciler written for one cluster: it uses only "the client"."""

    async def reconcile(request: mcr.Request) -> None:
        seen.calls[request.cluster] += 1
        try:
            obj = await manager.client.get(CONFIGMAP, request.name, namespace=request.namespace)
        except mcr.NotFound:
            seen.objects.pop((request.cluster, request.namespace, request.name), None)
            return
        seen.objects[(request.cluster, request.namespace, request.name)] = (obj.get("data") or {}).get("v")

    return reconcile


async def _seed(plane: ControlPlane, namespace: str, names: list[str], value: str | None = None) -> None:
    async with mcr.Cluster("seed", config_of(plane)) as cluster:
        with contextlib.suppress(mcr.AlreadyExists):
            await cluster.client.create(
                {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}
            )
        for name in names:
            await cluster.client.create(configmap(name, namespace, v=value or plane.name))


def _in_namespace(namespace: str) -> tuple[mcr.Predicate, ...]:
    return (mcr.in_namespaces(namespace),)


async def test_a_uniform_reconciler_sees_every_object_in_every_cluster(fleet: Fleet) -> None:
    namespace = unique("uniform")
    for plane in fleet:
        await _seed(plane, namespace, ["a", "b"])
    provider = mcr.StaticProvider({plane.name: config_of(plane) for plane in fleet})
    manager = mcr.Manager(provider, handle_signals=False)
    seen = Seen()
    mcr.controller_managed_by(manager).for_(CONFIGMAP, predicates=_in_namespace(namespace)).complete(
        uniform_reconciler(manager, seen)
    )
    async with running(manager):
        expected = {(plane.name, namespace, name): plane.name for plane in fleet for name in ("a", "b")}
        await wait_until(lambda: seen.objects == expected)
        # Each value was read from the request's own cluster: the value is the cluster name.
        assert all(value == cluster for (cluster, _ns, _name), value in seen.objects.items())


async def test_single_cluster_mode_runs_the_same_reconciler(fleet: Fleet) -> None:
    plane = fleet["cluster-1"]
    namespace = unique("single")
    await _seed(plane, namespace, ["only"])
    manager = mcr.Manager(local=config_of(plane), handle_signals=False)
    seen = Seen()
    mcr.controller_managed_by(manager).for_(CONFIGMAP, predicates=_in_namespace(namespace)).complete(
        uniform_reconciler(manager, seen)
    )
    async with running(manager):
        await wait_until(lambda: seen.objects == {(mcr.LOCAL_CLUSTER, namespace, "only"): "cluster-1"})


async def test_clusters_added_removed_and_replaced_while_running(fleet: Fleet, testbed: Fleet) -> None:
    namespace = unique("churn")
    first, second = fleet["cluster-1"], fleet["cluster-2"]
    for plane in (first, second):
        await _seed(plane, namespace, ["x"])
    provider = mcr.StaticProvider({"first": config_of(first)})
    manager = mcr.Manager(provider, handle_signals=False)
    seen = Seen()
    controller = (
        mcr.controller_managed_by(manager)
        .for_(CONFIGMAP, predicates=_in_namespace(namespace))
        .complete(uniform_reconciler(manager, seen))
    )
    async with running(manager):
        await wait_until(lambda: seen.clusters_with(namespace) == {"first"})

        # Added at runtime: reconciled.
        await provider.set("second", config_of(second))
        await wait_until(lambda: seen.clusters_with(namespace) == {"first", "second"})

        # Removed: no longer reconciled, and nothing of it is left running.
        removed = await manager.get_cluster("second")
        await provider.remove("second")
        assert removed.stopped and len(removed.tasks) == 0 and removed.transport.closed
        assert "second" not in controller.engaged() and "second" not in manager.clusters()
        calls = seen.calls["second"]
        async with mcr.Cluster("writer", config_of(second)) as writer:
            await writer.client.patch(CONFIGMAP, "x", {"data": {"v": "after-removal"}}, namespace=namespace)
        await _seed(first, namespace, ["marker"])  # an event that is processed after the patch above
        await wait_until(lambda: ("first", namespace, "marker") in seen.objects)
        assert seen.calls["second"] == calls

        # Replaced under the same name with another cluster: exactly the new one is engaged.
        old = await manager.get_cluster("first")
        await provider.set("first", config_of(second))
        await wait_until(lambda: seen.objects.get(("first", namespace, "x")) == "after-removal")
        new = await manager.get_cluster("first")
        assert new is not old and old.stopped
        assert controller.engaged() == {"first": new}
        assert manager.clusters() == {"first": new}
        assert provider.statuses()["first"].engagements == 2


async def test_an_unchanged_update_does_not_re_engage(fleet: Fleet) -> None:
    plane = fleet["cluster-3"]
    provider = mcr.StaticProvider({"c": config_of(plane)})
    manager = mcr.Manager(provider, handle_signals=False)
    mcr.controller_managed_by(manager).named("noop").for_(CONFIGMAP).complete(_nothing)
    async with running(manager):
        cluster = await provider.clusters.wait_engaged("c")
        assert await provider.set("c", config_of(plane)) is False
        assert await manager.get_cluster("c") is cluster
        assert provider.statuses()["c"].engagements == 1


async def _nothing(_request: mcr.Request) -> None:
    return None


async def test_a_rotated_token_is_swapped_in_place(fleet: Fleet) -> None:
    plane = fleet["cluster-3"]
    before, after = plane.add_token_user(unique("before")), plane.add_token_user(unique("after"))
    provider = mcr.StaticProvider({"c": mcr.kubeconfig_from_dict(plane.kubeconfig(before))})
    manager = mcr.Manager(provider, handle_signals=False)
    mcr.controller_managed_by(manager).named("noop").for_(CONFIGMAP).complete(_nothing)
    async with running(manager):
        cluster = await provider.clusters.wait_engaged("c")
        assert await provider.set("c", mcr.kubeconfig_from_dict(plane.kubeconfig(after))) is True
        assert await manager.get_cluster("c") is cluster  # caches kept
        assert provider.statuses()["c"].credential_rotations == 1
        assert await cluster.transport.authorization() == f"Bearer {after.token}"


async def test_a_controller_added_later_is_engaged_with_every_cluster(fleet: Fleet) -> None:
    provider = mcr.StaticProvider({plane.name: config_of(plane) for plane in fleet})
    manager = mcr.Manager(provider, handle_signals=False)
    mcr.controller_managed_by(manager).named("early").for_(CONFIGMAP).complete(_nothing)
    async with running(manager):
        for plane in fleet:
            await provider.clusters.wait_engaged(plane.name)
        late = mcr.controller_managed_by(manager).named("late").for_(CONFIGMAP).complete(_nothing)
        await wait_until(lambda: set(late.engaged()) == set(fleet.names))
        await wait_until(lambda: all(late.synced(name) for name in fleet.names))


async def test_other_clusters_keep_reconciling_while_one_apiserver_is_down(
    fleet: Fleet, fresh_cluster: ControlPlane
) -> None:
    namespace = unique("outage")
    healthy = fleet["cluster-2"]
    await _seed(healthy, namespace, ["h0"])
    await _seed(fresh_cluster, namespace, ["f0"])
    options = mcr.ClusterOptions(retry=mcr.RetryPolicy(attempts=1), watch_read_timeout=5.0)
    provider = mcr.StaticProvider(
        {"healthy": config_of(healthy), "flaky": config_of(fresh_cluster)},
        options=options,
        probe_interval=0.5,
    )
    manager = mcr.Manager(provider, handle_signals=False)
    seen = Seen()
    mcr.controller_managed_by(manager).for_(CONFIGMAP, predicates=_in_namespace(namespace)).complete(
        uniform_reconciler(manager, seen)
    )
    async with running(manager):
        await wait_until(lambda: seen.clusters_with(namespace) == {"healthy", "flaky"})
        await fresh_cluster.stop_async()
        await wait_until(lambda: provider.statuses()["flaky"].phase is mcr.ClusterPhase.UNHEALTHY)
        assert "flaky" in manager.clusters()  # unavailable is not gone
        await _seed(healthy, namespace, ["h1"])
        await wait_until(lambda: ("healthy", namespace, "h1") in seen.objects)
        await fresh_cluster.start_async()
        await _seed(fresh_cluster, namespace, ["f1"])
        await wait_until(lambda: ("flaky", namespace, "f1") in seen.objects, timeout=60)
        await wait_until(lambda: provider.statuses()["flaky"].phase is mcr.ClusterPhase.READY)


async def test_requests_for_a_removed_cluster_are_dropped_not_retried(fleet: Fleet) -> None:
    namespace = unique("dropped")
    plane = fleet["cluster-1"]
    await _seed(plane, namespace, ["a", "b", "c"])
    provider = mcr.StaticProvider({"doomed": config_of(plane)})
    manager = mcr.Manager(provider, handle_signals=False)
    attempts: defaultdict[str, int] = defaultdict(int)

    async def always_failing(request: mcr.Request) -> None:
        attempts[request.name] += 1
        await manager.get_cluster(request.cluster)
        raise RuntimeError("keeps failing")

    controller = (
        mcr.controller_managed_by(manager)
        .for_(CONFIGMAP, predicates=_in_namespace(namespace))
        .with_options(rate_limiter=ExponentialBackoff(base=0.05, cap=0.2))
        .complete(always_failing)
    )
    async with running(manager):
        await wait_until(lambda: all(attempts[name] >= 2 for name in "abc"))
        await provider.remove("doomed")
        assert controller.queue.depth_by_group().get("doomed", 0) == 0
        settled = dict(attempts)
        marker = mcr.Request("doomed", namespace, "a")
        controller.queue.add(marker)  # a straggler from a map function
        await wait_until(lambda: controller.stats.dropped_cluster_gone >= 1)
        assert controller.queue.delayed_count == 0
        assert sum(attempts.values()) <= sum(settled.values()) + 1


def _member_names(manager: mcr.Manager) -> list[str]:
    return sorted(name for name in manager.clusters() if name != mcr.LOCAL_CLUSTER)


async def test_a_hub_object_fans_out_to_members_and_aggregates_their_status(
    fleet: Fleet, testbed: Fleet
) -> None:
    """The seed article's scenario: a Test on the hub makes a child in every member,
    the children's phases become the Test's status, deleting the Test removes them."""
    from kube_helpers import install_widget_crd, running_cluster

    hub_plane = fleet["cluster-1"]
    members = {"m1": fleet["cluster-2"], "m2": fleet["cluster-3"]}
    namespace = unique("fanout")
    async with running_cluster(hub_plane, name="setup") as setup:
        widget = await install_widget_crd(setup)
        await setup.client.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
    for plane in members.values():
        await _seed(plane, namespace, [])

    provider = mcr.StaticProvider({name: config_of(plane) for name, plane in members.items()})
    manager = mcr.Manager(provider, local=config_of(hub_plane), handle_signals=False)
    owner_label = "fanout.mcruntime.dev/owner"
    finalizer = "fanout.mcruntime.dev/children"

    def child_to_owner(_cluster: str, child: dict[str, object]) -> list[mcr.Request]:
        metadata = child["metadata"]
        assert isinstance(metadata, dict)
        labels = metadata.get("labels") or {}
        owner = labels.get(owner_label)
        return [mcr.Request(mcr.LOCAL_CLUSTER, namespace, owner)] if owner else []

    async def reconcile(request: mcr.Request) -> mcr.Result | None:
        hub = await manager.get_cluster(request.cluster)
        test = await hub.cache.get_or_none(widget, request.name, namespace=request.namespace)
        if test is None:
            return None
        members_now = _member_names(manager)
        if test["metadata"].get("deletionTimestamp"):
            for member in members_now:
                cluster = await manager.get_cluster(member)
                with contextlib.suppress(mcr.NotFound):
                    await cluster.client.delete(CONFIGMAP, f"{request.name}-child", namespace=namespace)
            await hub.client.patch(
                widget, request.name, {"metadata": {"finalizers": None}}, namespace=namespace
            )
            return None
        if finalizer not in (test["metadata"].get("finalizers") or []):
            await hub.client.patch(
                widget, request.name, {"metadata": {"finalizers": [finalizer]}}, namespace=namespace
            )
        phases = {}
        for member in members_now:
            cluster = await manager.get_cluster(member)
            child = await cluster.cache.get_or_none(CONFIGMAP, f"{request.name}-child", namespace=namespace)
            if child is None:
                manifest = configmap(f"{request.name}-child", namespace, phase="running")
                manifest["metadata"]["labels"] = {owner_label: request.name}
                await cluster.client.apply(manifest, field_manager="fanout")
                phases[member] = "running"
            else:
                phases[member] = (child.get("data") or {}).get("phase", "running")
        if any(phase == "error" for phase in phases.values()):
            overall = "error"
        elif phases and all(phase == "finished" for phase in phases.values()):
            overall = "finished"
        else:
            overall = "running"
        status = {"phase": overall, "children": phases}
        if test.get("status") != status:
            await hub.client.patch(
                widget, request.name, {"status": status}, namespace=namespace, subresource="status"
            )
        return None

    (
        mcr.controller_managed_by(manager)
        .named("fanout")
        .for_(widget, clusters=mcr.LOCAL_ONLY)
        .watches(
            CONFIGMAP,
            mcr.enqueue_mapped(child_to_owner),
            clusters=mcr.PROVIDER_ONLY,
            label_selector=owner_label,
        )
        .complete(reconcile)
    )
    async with running(manager), running_cluster(hub_plane, name="user") as user:
        await user.client.create(
            {
                "apiVersion": widget.api_version,
                "kind": "Widget",
                "metadata": {"name": "t1", "namespace": namespace},
            }
        )

        async def hub_phase() -> str | None:
            obj = await user.client.get(widget, "t1", namespace=namespace)
            return (obj.get("status") or {}).get("phase")

        async def phase_is(expected: str) -> bool:
            return await hub_phase() == expected

        await wait_until(lambda: phase_is("running"))
        for name, plane in members.items():
            async with running_cluster(plane, name=name) as member:
                await member.client.patch(
                    CONFIGMAP, "t1-child", {"data": {"phase": "finished"}}, namespace=namespace
                )
        await wait_until(lambda: phase_is("finished"))
        async with running_cluster(members["m1"], name="m1") as member:
            await member.client.patch(
                CONFIGMAP, "t1-child", {"data": {"phase": "error"}}, namespace=namespace
            )
        await wait_until(lambda: phase_is("error"))

        await user.client.delete(widget, "t1", namespace=namespace)

        async def children_gone() -> bool:
            for plane in members.values():
                async with running_cluster(plane, name="check") as member:
                    try:
                        await member.client.get(CONFIGMAP, "t1-child", namespace=namespace)
                        return False
                    except mcr.NotFound:
                        continue
            return True

        await wait_until(children_gone)

        async def hub_gone() -> bool:
            try:
                await user.client.get(widget, "t1", namespace=namespace)
            except mcr.NotFound:
                return True
            return False

        await wait_until(hub_gone)


async def test_the_fleet_client_reports_per_cluster_results_and_errors(
    fleet: Fleet, fresh_cluster: ControlPlane
) -> None:
    namespace = unique("fleetread")
    for plane in (fleet["cluster-1"], fleet["cluster-2"]):
        await _seed(plane, namespace, ["x"])
    options = mcr.ClusterOptions(retry=mcr.RetryPolicy(attempts=1), cache_sync_timeout=2.0)
    provider = mcr.StaticProvider(
        {
            "one": config_of(fleet["cluster-1"]),
            "two": config_of(fleet["cluster-2"]),
            "down": config_of(fresh_cluster),
        },
        options=options,
    )
    manager = mcr.Manager(provider, handle_signals=False)
    await fresh_cluster.stop_async()
    async with running(manager):
        for name in ("one", "two", "down"):
            await provider.clusters.wait_engaged(name)
        result = await manager.fleet.list(CONFIGMAP, namespace=namespace, timeout=5)
        assert {name: [o["metadata"]["name"] for o in items] for name, items in result.results.items()} == {
            "one": ["x"],
            "two": ["x"],
        }
        assert set(result.errors) == {"down"}
        got = await manager.fleet.get(CONFIGMAP, "x", namespace=namespace, clusters=["one", "nowhere"])
        assert got.results["one"] is not None
        assert isinstance(got.errors["nowhere"], mcr.ClusterNotFound)


async def test_the_multi_provider_composes_providers_under_prefixes(fleet: Fleet) -> None:
    namespace = unique("multi")
    for plane in fleet:
        await _seed(plane, namespace, ["x"])
    east = mcr.StaticProvider({"a": config_of(fleet["cluster-1"]), "b": config_of(fleet["cluster-2"])})
    west = mcr.SingleProvider("a", config_of(fleet["cluster-3"]))
    provider = mcr.MultiProvider({"east": east, "west": west})
    manager = mcr.Manager(provider, handle_signals=False)
    seen = Seen()
    mcr.controller_managed_by(manager).for_(CONFIGMAP, predicates=_in_namespace(namespace)).complete(
        uniform_reconciler(manager, seen)
    )
    async with running(manager):
        await wait_until(lambda: seen.clusters_with(namespace) == {"east/a", "east/b", "west/a"})
        assert seen.objects[("west/a", namespace, "x")] == "cluster-3"
        assert (await manager.get_cluster("east/b")) is (await east.get("b"))
        for missing in ("east/zzz", "north/a", "west"):
            with pytest.raises(mcr.ClusterNotFound) as raised:
                await provider.get(missing)
            assert raised.value.cluster == missing


async def test_sigterm_stops_intake_and_lets_in_flight_reconciles_finish(fleet: Fleet) -> None:
    import os
    import signal

    namespace = unique("sigterm")
    await _seed(fleet["cluster-1"], namespace, ["slow"])
    manager = mcr.Manager(local=config_of(fleet["cluster-1"]), graceful_shutdown_timeout=10)
    started, finished = asyncio.Event(), asyncio.Event()

    async def slow(_request: mcr.Request) -> None:
        started.set()
        await asyncio.sleep(0.5)  # the work being done, not synchronisation
        finished.set()

    mcr.controller_managed_by(manager).for_(CONFIGMAP, predicates=_in_namespace(namespace)).complete(slow)
    before = asyncio.all_tasks()
    runner = asyncio.create_task(manager.start())
    await asyncio.wait_for(started.wait(), 30)
    os.kill(os.getpid(), signal.SIGTERM)
    await asyncio.wait_for(runner, 30)
    assert finished.is_set()
    assert manager.local is not None and manager.local.stopped
    assert {t for t in asyncio.all_tasks() - before if t is not asyncio.current_task()} == set()


async def test_the_routed_client_outside_a_reconcile_says_so() -> None:
    manager = mcr.Manager(mcr.StaticProvider(), handle_signals=False)
    with pytest.raises(mcr.ClusterNotFound) as raised:
        await manager.client.get(mcr.Kind("v1", "ConfigMap"), "x", namespace="default")
    assert "outside a reconcile" in str(raised.value) and "get_cluster" in str(raised.value)


async def test_the_routed_client_applies_with_the_default_field_manager_and_reads_metadata_only(
    fleet: Fleet,
) -> None:
    """A reconciler written for one cluster uses mgr.client alone: apply without naming a manager, lean reads."""
    plane = fleet["cluster-2"]
    namespace = unique("routed")
    await _seed(plane, namespace, ["source"])
    manager = mcr.Manager(
        mcr.StaticProvider({"c": config_of(plane)}), handle_signals=False, field_manager="routed"
    )
    seen: dict[str, object] = {}

    async def reconcile(request: mcr.Request) -> None:
        if request.name != "source":
            return
        lean = await manager.client.get(CONFIGMAP, "source", namespace=namespace, metadata_only=True)
        listed = await manager.client.list(CONFIGMAP, namespace=namespace, metadata_only=True)
        await manager.client.apply(configmap("copy", namespace, v="1"))  # no field_manager: the manager's
        seen["lean"], seen["listed"] = lean, [obj["metadata"]["name"] for obj in listed]

    mcr.controller_managed_by(manager).for_(
        CONFIGMAP, predicates=_in_namespace(namespace), metadata_only=True
    ).complete(reconcile)
    async with running(manager):
        await wait_until(lambda: "lean" in seen)
        cluster = await manager.get_cluster("c")
        copy = await cluster.client.get(CONFIGMAP, "copy", namespace=namespace)
        views = [
            informer.metadata_only for informer in cluster.cache.informers() if informer.kind == CONFIGMAP
        ]
    lean = seen["lean"]
    assert isinstance(lean, dict) and "data" not in lean and lean["metadata"]["name"] == "source"
    assert "source" in seen["listed"]  # type: ignore[operator]
    assert [entry["manager"] for entry in copy["metadata"]["managedFields"]] == ["routed"]
    assert views == [True], "a metadata-only reconciler made the cache hold the kind whole as well"
