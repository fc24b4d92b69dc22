"""A cluster that leaves, comes back or is replaced: nothing of the old one is kept, nothing of the new one is lost.

From an outside review. A key whose reconcile still ran when its cluster was
replaced (or left and came back) was never reconciled by the new engagement:
the queue took the new informer's add for the old reconcile's retry and
dropped it, in silence. And ``owns(...)`` kept every departed cluster alive,
with its client and caches, for the life of the process.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import weakref

import pytest
from kube_helpers import CONFIGMAP, configmap, unique

import mcruntime as mcr
from mcruntime.testing import ControlPlane, Fleet, admin_config, running, wait_until

NAMESPACE = mcr.Kind("v1", "Namespace")
SECRET = mcr.Kind("v1", "Secret")


async def _namespace(plane: ControlPlane, objects: list[str]) -> str:
    namespace = unique("rejoin")
    async with mcr.Cluster("setup", admin_config(plane)) as setup:
        await setup.client.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
        for name in objects:
            await setup.client.create(configmap(name, namespace, v="1"))
    return namespace


def _replacement(plane: ControlPlane) -> mcr.ClusterConfig:
    """The same API server reached another way (``localhost``): a changed config, so a new Cluster."""
    data = plane.kubeconfig()
    cluster = data["clusters"][0]["cluster"]
    cluster["server"] = cluster["server"].replace("127.0.0.1", "localhost")
    return mcr.kubeconfig_from_dict(data)


@pytest.mark.parametrize("how", ["removed-and-set-again", "replaced"])
async def test_a_key_in_flight_when_its_cluster_comes_back_is_reconciled_by_the_new_engagement(
    fleet: Fleet, how: str
) -> None:
    plane = fleet["cluster-1"]
    namespace = await _namespace(plane, ["held", "free"])
    provider = mcr.StaticProvider({"member": admin_config(plane)})
    manager = mcr.Manager(provider, handle_signals=False)
    entered, release = asyncio.Event(), asyncio.Event()
    done: list[tuple[str, int]] = []  # (name, id of the Cluster that reconciled it)

    async def reconcile(request: mcr.Request) -> None:
        cluster = await manager.get_cluster(request.cluster)
        if request.name == "held" and not release.is_set():
            entered.set()
            await release.wait()  # still running when its cluster goes
        done.append((request.name, id(cluster)))

    mcr.controller_managed_by(manager).named(unique("rejoin")).for_(
        CONFIGMAP, namespace=namespace
    ).with_options(max_concurrent_reconciles=2).complete(reconcile)
    async with running(manager):
        old = await provider.clusters.wait_engaged("member")
        await asyncio.wait_for(entered.wait(), timeout=30)
        await wait_until(lambda: ("free", id(old)) in done, what="the free key reconciled")
        if how == "replaced":
            await provider.set("member", _replacement(plane))
        else:
            await provider.remove("member")
            await provider.set("member", admin_config(plane))
        await wait_until(lambda: manager.clusters().get("member") not in (None, old), what="the member back")
        new = manager.clusters()["member"]
        await wait_until(
            lambda: ("free", id(new)) in done, what="the free key reconciled by the new engagement"
        )
        release.set()  # the old engagement's reconcile ends: the new one's add must not be lost
        await wait_until(
            lambda: ("held", id(new)) in done, what="the held key reconciled by the new engagement"
        )
    async with mcr.Cluster("cleanup", admin_config(plane)) as cleanup:
        await cleanup.client.delete(NAMESPACE, namespace)


async def test_owns_lets_go_of_the_clusters_that_left(fleet: Fleet) -> None:
    plane = fleet["cluster-2"]
    namespace = await _namespace(plane, ["owner"])
    provider = mcr.StaticProvider()
    manager = mcr.Manager(provider, handle_signals=False, gc_freeze=False)  # the collector sees everything
    reconciled: set[str] = set()

    async def reconcile(request: mcr.Request) -> None:
        reconciled.add(request.cluster)

    mcr.controller_managed_by(manager).named(unique("owns")).for_(CONFIGMAP, namespace=namespace).owns(
        SECRET
    ).complete(reconcile)
    gone: list[weakref.ref[mcr.Cluster]] = []
    async with running(manager):
        for round_ in range(3):
            name = f"member-{round_}"
            await provider.set(name, admin_config(plane))
            cluster = await provider.clusters.wait_engaged(name)
            await wait_until(lambda name=name: name in reconciled, what=f"{name} reconciled")  # type: ignore[misc]
            gone.append(weakref.ref(cluster))
            del cluster
            await provider.remove(name)
            await wait_until(lambda name=name: name not in manager.clusters(), what=f"{name} gone")  # type: ignore[misc]

        def alive() -> list[str]:
            gc.collect()
            return [repr(ref()) for ref in gone if ref() is not None]

        await wait_until(lambda: not alive(), what="no departed cluster alive")
    async with mcr.Cluster("cleanup", admin_config(plane)) as cleanup:
        await cleanup.client.delete(NAMESPACE, namespace)


async def test_a_reconcile_whose_cluster_left_meanwhile_is_dropped_and_says_why(
    fleet: Fleet, caplog: pytest.LogCaptureFixture
) -> None:
    # Found by a review: its next request failed "Unreachable ... the cluster was stopped", and
    # the log said "failed (retry 0)", a retry that never came (the cluster was purged).
    plane = fleet["cluster-3"]
    namespace = await _namespace(plane, ["held"])
    provider = mcr.StaticProvider({"leaving": admin_config(plane)})
    manager = mcr.Manager(provider, handle_signals=False)
    entered, release = asyncio.Event(), asyncio.Event()
    name = unique("leaving")

    async def reconcile(request: mcr.Request) -> None:
        cluster = await manager.get_cluster(request.cluster)
        entered.set()
        await release.wait()
        await cluster.client.get(CONFIGMAP, request.name, namespace=request.namespace)  # after the stop

    mcr.controller_managed_by(manager).named(name).for_(CONFIGMAP, namespace=namespace).complete(reconcile)
    caplog.set_level(logging.INFO, "mcruntime.controller")
    async with running(manager):
        await asyncio.wait_for(entered.wait(), timeout=30)
        await provider.remove("leaving")
        release.set()

        def said() -> list[str]:
            return [
                r.getMessage()
                for r in caplog.records
                if r.name == "mcruntime.controller" and name in r.getMessage()
            ]

        await wait_until(lambda: any("dropped" in line for line in said()), what="the drop logged")
    lines = said()
    assert any(
        f"{name}: " in line and "dropped: cluster 'leaving' left while it was reconciled" in line
        for line in lines
    ), lines
    assert not [line for line in lines if "retry" in line], lines
    async with mcr.Cluster("cleanup", admin_config(plane)) as cleanup:
        await cleanup.client.delete(NAMESPACE, namespace)
