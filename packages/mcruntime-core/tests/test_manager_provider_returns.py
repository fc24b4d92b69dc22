"""A provider whose ``run()`` returns while the manager runs is named, not left to end discovery in silence.

``Provider.run`` runs until cancelled. One that returns (a loop that ended on
a condition it should not have, a one-shot setup) leaves the manager running
with the clusters it engaged and nothing to engage or disengage any more:
the manager logged nothing, and its health kept saying all was well.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping

import pytest

import mcruntime as mcr
from mcruntime.cache import IndexFunc
from mcruntime.testing import wait_until


class OnlyGets:
    """A provider that answers get() and runs nothing."""

    async def get(self, name: str) -> mcr.Cluster:
        raise mcr.ClusterNotFound(name)

    async def index_field(self, kind: mcr.Kind, name: str, extract: IndexFunc) -> None:
        return None

    def statuses(self) -> Mapping[str, mcr.ClusterStatus]:
        return {}


class ReturnsAtOnce(OnlyGets):
    """A provider whose run() ends by itself."""

    def __init__(self) -> None:
        self.returned = asyncio.Event()

    async def run(self, aware: mcr.Aware) -> None:
        self.returned.set()


def _said(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "mcruntime.manager" and r.levelno == logging.WARNING
    ]


async def test_a_provider_whose_run_returns_is_named_at_warning(caplog: pytest.LogCaptureFixture) -> None:
    provider = ReturnsAtOnce()
    manager = mcr.Manager(provider, handle_signals=False)
    runner = asyncio.create_task(manager.start())
    try:
        await manager.wait_started()
        await provider.returned.wait()
        await wait_until(lambda: bool(_said(caplog)), timeout=10, what="the warning")
    finally:
        manager.stop()
        await runner
    assert _said(caplog) == [
        "the provider's run() returned while the manager runs: ReturnsAtOnce engages and disengages no more "
        "clusters from now on (the 0 engaged stay); a provider's run() is to run until cancelled"
    ]


async def test_a_provider_cancelled_at_the_stop_is_not_named(caplog: pytest.LogCaptureFixture) -> None:
    manager = mcr.Manager(mcr.StaticProvider(), handle_signals=False)
    runner = asyncio.create_task(manager.start())
    await manager.wait_started()
    manager.stop()
    await runner
    assert _said(caplog) == []


async def test_a_multi_provider_of_members_that_do_not_run_runs_until_cancelled(
    caplog: pytest.LogCaptureFixture,
) -> None:
    multi = mcr.MultiProvider({"a": OnlyGets()})
    run = asyncio.create_task(multi.run(mcr.Manager(mcr.StaticProvider(), handle_signals=False)))
    await asyncio.sleep(0)  # one turn: a run() that returns at once has returned now
    assert not run.done()
    run.cancel()
    with pytest.raises(asyncio.CancelledError):
        await run


def _provider_said(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "mcruntime.provider" and r.levelno == logging.WARNING
    ]


async def test_a_multi_provider_member_whose_run_returns_is_named_and_the_others_run_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # The manager sees only the MultiProvider, which runs on while any member runs:
    # the member's discovery ended with no word.
    returning = ReturnsAtOnce()
    running_member = mcr.StaticProvider()
    multi = mcr.MultiProvider({"gone": returning, "live": running_member})
    manager = mcr.Manager(multi, handle_signals=False)
    runner = asyncio.create_task(manager.start())
    try:
        await manager.wait_started()
        await returning.returned.wait()
        await wait_until(lambda: bool(_provider_said(caplog)), timeout=10, what="the member's warning")
        assert not runner.done()
    finally:
        manager.stop()
        await runner
    assert _provider_said(caplog) == [
        "the run() of MultiProvider member 'gone' (ReturnsAtOnce) returned while the manager runs: it engages "
        "and disengages no more clusters from now on (its 0 known stay); a provider's run() is to run until "
        "cancelled"
    ]
    assert _said(caplog) == []  # the MultiProvider itself ran until cancelled
