"""Synced caches leave the cyclic garbage collector's generations, once per burst of syncs."""

from __future__ import annotations

import gc

import pytest
from kube_helpers import CONFIGMAP

import mcruntime as mcr
from mcruntime._manager.gcfreeze import CacheFreezer
from mcruntime.testing import ControlPlane, Fleet, running, wait_until


def config_of(plane: ControlPlane) -> mcr.ClusterConfig:
    return mcr.kubeconfig_from_dict(plane.kubeconfig())


async def _nothing(_request: mcr.Request) -> None:
    return None


async def test_the_heap_is_frozen_once_after_a_burst_of_cluster_syncs(fleet: Fleet) -> None:
    provider = mcr.StaticProvider({name: config_of(fleet[name]) for name in ("cluster-1", "cluster-2")})
    manager = mcr.Manager(provider, handle_signals=False)
    mcr.controller_managed_by(manager).for_(CONFIGMAP).complete(_nothing)
    gc.unfreeze()
    async with running(manager):
        await wait_until(lambda: manager.freezer.freezes >= 1, timeout=30)
        assert gc.get_freeze_count() > 0
    gc.unfreeze()


async def test_a_burst_of_syncs_leads_to_one_freeze() -> None:
    freezer = CacheFreezer(True, delay=0.05)
    gc.unfreeze()
    for _ in range(1000):  # a fleet engaging: every cluster's caches sync within the delay
        freezer.synced()
    await wait_until(lambda: freezer.freezes >= 1, timeout=5)
    assert freezer.freezes == 1 and gc.get_freeze_count() > 0
    gc.unfreeze()
    freezer.synced()
    await wait_until(lambda: freezer.freezes == 2, timeout=5)
    gc.unfreeze()


async def test_freezing_can_be_turned_off_from_the_environment(
    fleet: Fleet, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MCRUNTIME_GC_FREEZE", "false")
    settings = mcr.ManagerSettings.load(metrics_bind_address="", health_probe_bind_address="")
    provider = mcr.StaticProvider({"cluster-1": config_of(fleet["cluster-1"])})
    manager = mcr.Manager.from_settings(provider, settings=settings, handle_signals=False)
    mcr.controller_managed_by(manager).for_(CONFIGMAP).complete(_nothing)
    gc.unfreeze()
    async with running(manager):
        await wait_until(
            lambda: all(controller.synced("cluster-1") for controller in manager.controllers.values())
        )
        assert not manager.freezer.enabled and manager.freezer.freezes == 0
        assert gc.get_freeze_count() == 0


async def test_a_costly_freeze_pushes_the_next_one_back_and_counts_nothing_unasked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # At 10,000 clusters a freeze walked a large heap, and the debug line counted every
    # frozen object even with debug logging off: a quarter of a joining replica's time.
    import asyncio
    import logging
    from types import SimpleNamespace

    from mcruntime._manager import gcfreeze

    clock = [100.0]
    counted: list[int] = []

    def slow_collect() -> int:
        clock[0] += 0.5  # a collection that took half a second
        return 0

    def count() -> int:
        counted.append(1)
        return 0

    monkeypatch.setattr("mcruntime._manager.gcfreeze.time", SimpleNamespace(perf_counter=lambda: clock[0]))
    monkeypatch.setattr(
        "mcruntime._manager.gcfreeze.gc",
        SimpleNamespace(collect=slow_collect, freeze=lambda: None, get_freeze_count=count),
    )
    logger = logging.getLogger("mcruntime.manager")
    previous = logger.level
    logger.setLevel(logging.INFO)
    try:
        freezer = CacheFreezer(True, delay=0.01)
        freezer.synced()
        await wait_until(lambda: freezer.freezes == 1, timeout=5)
        assert freezer.last_cost == 0.5
        assert not counted
        freezer.synced()
        pending = freezer._pending
        assert pending is not None
        assert pending.when() - asyncio.get_running_loop().time() >= 0.5 * gcfreeze.COST_FACTOR - 0.1
        freezer.cancel()
    finally:
        logger.setLevel(previous)
