"""A Runnable added after the start is watched as one added before: its crash stops the manager.

The manager took the tasks it watches once, at the start. A Runnable added
later with ``Manager.add`` could crash unseen: the manager ran on without it,
and its error was thrown away at shutdown.
"""

from __future__ import annotations

import asyncio
import logging

import pytest

import mcruntime as mcr


class Crashes:
    """A Runnable that fails once it is told to."""

    def __init__(self) -> None:
        self.go = asyncio.Event()

    async def start(self) -> None:
        await self.go.wait()
        raise RuntimeError("the late component broke")

    def __repr__(self) -> str:
        return "Crashes()"


@pytest.mark.parametrize("late", [False, True], ids=["added-before-start", "added-after-start"])
async def test_a_crashing_runnable_stops_the_manager_with_its_error(
    late: bool, caplog: pytest.LogCaptureFixture
) -> None:
    manager = mcr.Manager(mcr.StaticProvider(), handle_signals=False)
    component = Crashes()
    if not late:
        manager.add(component)
    runner = asyncio.create_task(manager.start())
    await manager.wait_started()
    if late:
        manager.add(component)
    component.go.set()
    with pytest.raises(RuntimeError, match="the late component broke"):
        await asyncio.wait_for(runner, 30)
    assert [
        r.getMessage() for r in caplog.records if r.name == "mcruntime.manager" and r.levelno == logging.ERROR
    ] == ["runnable:Crashes() failed; shutting down"]


async def test_a_late_runnable_that_finishes_leaves_the_watch_running() -> None:
    manager = mcr.Manager(mcr.StaticProvider(), handle_signals=False)
    finished = asyncio.Event()

    class Finishes:
        async def start(self) -> None:
            finished.set()

    runner = asyncio.create_task(manager.start())
    await manager.wait_started()
    manager.add(Finishes())
    await finished.wait()
    crashing = Crashes()  # a finished component neither stops the manager nor ends the watch
    manager.add(crashing)
    crashing.go.set()
    with pytest.raises(RuntimeError, match="the late component broke"):
        await asyncio.wait_for(runner, 30)
