"""Synced caches leave the cyclic garbage collector's generations, once per burst of syncs."""

from __future__ import annotations

import asyncio
import gc
import weakref

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
        # Once at start, before any cache fills: the program's own objects.
        assert manager.freezer.freezes >= 1 and gc.get_freeze_count() > 0
        await wait_until(lambda: manager.freezer.freezes >= 2, timeout=30)
    gc.unfreeze()


async def test_a_burst_of_syncs_leads_to_one_freeze() -> None:
    freezer = CacheFreezer(True, delay=0.05)
    gc.unfreeze()
    for _ in range(1000):  # a fleet engaging: every cluster's caches sync within the delay
        freezer.synced()
    await wait_until(lambda: freezer.freezes >= 1, timeout=5)
    assert freezer.freezes == 1 and gc.get_freeze_count() > 0
    gc.unfreeze()
    freezer.synced()  # the next burst: frozen again, once the first freeze's cost allows
    await wait_until(lambda: freezer.freezes == 2, timeout=60)
    gc.unfreeze()


class _Kept:
    """An object the collector tracks."""


def _ours(freezer: CacheFreezer) -> bool:
    return any(getattr(callback, "__self__", None) is freezer for callback in gc.callbacks)


async def test_during_a_burst_each_full_collection_is_followed_by_a_freeze() -> None:
    """A cold start's full collections must not each walk all the burst has cached so far (S12)."""
    freezer = CacheFreezer(True, delay=3600.0, pace=0.0, longest=3600.0)
    gc.unfreeze()
    kept = _Kept()
    gc.collect()
    assert freezer.rides == 0 and any(kept is candidate for candidate in gc.get_objects())  # no burst yet
    freezer.engaging()  # a cluster engages: its caches are about to fill
    young = _Kept()
    gc.collect(1)  # a young collection: what it keeps may still turn into garbage soon
    assert freezer.rides == 0
    gc.collect()  # a full one: every survivor was just found reachable
    assert freezer.rides == 1 and freezer.freezes == 0  # no collection of our own
    assert all(young is not candidate and kept is not candidate for candidate in gc.get_objects())
    # The burst ends with its own freeze; later full collections freeze nothing.
    pending = _pending(freezer)
    assert pending is not None
    pending.cancel()
    freezer._freeze()
    assert not _ours(freezer)
    gc.unfreeze()
    gc.collect()
    assert freezer.rides == 1 and gc.get_freeze_count() == 0
    freezer.engaging()
    assert _ours(freezer)
    freezer.cancel()  # a manager shutting down stops following the collector
    assert not _ours(freezer)
    gc.collect()
    assert freezer.rides == 1 and gc.get_freeze_count() == 0


async def test_the_program_itself_is_frozen_at_start() -> None:
    """Modules and configuration live as long as the process: no full collection should walk them."""
    gc.unfreeze()
    kept = _Kept()  # a container alive before the start
    CacheFreezer(False).started()
    assert gc.get_freeze_count() == 0  # turned off: nothing moves
    freezer = CacheFreezer(True)
    freezer.started()
    assert freezer.freezes == 1 and gc.get_freeze_count() > 0
    assert all(kept is not candidate for candidate in gc.get_objects())  # frozen: out of every generation
    freezer.cancel()  # the start began a burst; this test's loop ends before it would settle
    gc.unfreeze()
    assert any(kept is candidate for candidate in gc.get_objects())


async def test_the_start_rides_the_providers_first_pass_until_the_first_engage_settles() -> None:
    """A provider's first pass over 10,000 kubeconfig files takes seconds before any cluster engages (S12)."""
    freezer = CacheFreezer(True, delay=0.05, pace=0.0, longest=3600.0)
    gc.unfreeze()
    loop = asyncio.get_running_loop()
    freezer.started()
    pending = freezer._pending
    assert pending is not None and pending.when() > loop.time() + 3000  # not the settling delay
    assert _ours(freezer)  # meanwhile, each full collection is followed by a freeze
    read = _Kept()  # what the provider's pass keeps
    gc.collect()
    assert freezer.rides == 1 and all(read is not candidate for candidate in gc.get_objects())
    freezer.engaging()  # the first cluster: from now on the burst settles after the usual delay
    await wait_until(lambda: freezer.freezes == 2, timeout=5)
    assert not _ours(freezer)
    freezer.cancel()
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


async def test_freezes_are_paced_by_their_own_cost() -> None:
    """A fleet's slow cold start syncs in trickles: each gap must not buy a full collection."""
    freezer = CacheFreezer(True, delay=0.01, pace=1e6)
    gc.unfreeze()
    freezer.synced()
    await wait_until(lambda: freezer.freezes == 1, timeout=5)
    loop = asyncio.get_running_loop()
    freezer.synced()
    pending = freezer._pending
    assert pending is not None
    assert pending.when() >= freezer._not_before > loop.time() + 1.0  # a million times its cost away
    freezer.cancel()
    assert freezer.freezes == 1
    gc.unfreeze()


async def test_a_burst_that_never_pauses_is_frozen_every_longest_wait() -> None:
    """A cold start of 10,000 clusters syncs without a gap for minutes: its heap must not wait for the end."""
    freezer = CacheFreezer(True, delay=3600.0, pace=0.0, longest=0.05)
    gc.unfreeze()
    loop = asyncio.get_running_loop()
    began = loop.time()
    freezer.synced()
    first = freezer._pending
    assert first is not None and first.when() == pytest.approx(began + 0.05, abs=0.01)
    async with asyncio.timeout(30):  # only so that a broken build fails instead of waiting forever
        while freezer.freezes < 2:  # syncs keep coming, each well within the hour-long settling delay
            freezer.synced()
            pending = freezer._pending
            assert pending is not None and pending.when() <= loop.time() + 0.05
            await asyncio.sleep(0.01)  # the next sync's arrival, not a wait for a condition
    assert gc.get_freeze_count() > 0
    freezer.cancel()
    gc.unfreeze()


async def test_a_stopped_clusters_frozen_cycles_are_collected_by_the_next_freeze() -> None:
    """Frozen objects are out of the collector's reach: a stopped cluster's cycles must not stay."""
    freezer = CacheFreezer(True, delay=0.01, pace=0.0)
    gc.unfreeze()
    cycle = _Kept()
    cycle.itself = cycle  # type: ignore[attr-defined]  # a reference cycle, as a cluster's tasks make
    alive = weakref.ref(cycle)
    freezer.synced()
    await wait_until(lambda: freezer.freezes == 1, timeout=5)
    del cycle
    gc.collect()
    assert alive() is not None  # frozen: no collection sees it
    freezer.stopped(engaged=0)
    await wait_until(lambda: freezer.freezes == 2, timeout=5)
    assert alive() is None and freezer.thaws == 1
    assert freezer.longest_thaw > 0.0
    gc.unfreeze()


def _pending(freezer: CacheFreezer) -> asyncio.TimerHandle | None:
    return freezer._pending


async def test_a_large_fleet_thaws_once_a_tenth_of_it_stopped() -> None:
    """Each thaw walks the whole heap on the loop (2.2 s at 10,000 clusters): a stop must not cost one."""
    freezer = CacheFreezer(True, delay=3600.0, pace=0.0, longest=3600.0)
    for _ in range(49):
        freezer.stopped(engaged=500)  # 50 of 500 make a tenth
    assert _pending(freezer) is None
    freezer.stopped(engaged=500)
    assert _pending(freezer) is not None and freezer._thaw
    freezer.cancel()


async def test_a_cancelled_freezer_schedules_nothing_until_it_starts_again() -> None:
    """A manager shutting down stops its own clusters after cancelling: no freeze may follow."""
    freezer = CacheFreezer(True, delay=0.01, pace=0.0)
    freezer.cancel()
    freezer.synced()
    freezer.stopped(engaged=0)
    assert _pending(freezer) is None
    gc.unfreeze()
    freezer.started()  # a manager started again freezes as before
    freezer.synced()
    assert _pending(freezer) is not None
    freezer.cancel()
    assert freezer.freezes == 1
    gc.unfreeze()
