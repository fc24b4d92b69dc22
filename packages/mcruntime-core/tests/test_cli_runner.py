"""The runner's outcomes that need no cluster: a manager that fails, and one stopped by its own program."""

from __future__ import annotations

import asyncio

import mcruntime as mcr
from mcruntime._cli.errors import ExitCode
from mcruntime._cli.runner import run_until_signalled


class Failing:
    """A runnable that fails at once, as a broken component would."""

    async def start(self) -> None:
        raise RuntimeError("the component broke")


class Stopping:
    """A runnable that stops its manager, as a program's own logic may (no signal involved)."""

    def __init__(self, manager: mcr.Manager) -> None:
        self.manager = manager

    async def start(self) -> None:
        self.manager.stop()
        await asyncio.Event().wait()  # until the shutdown cancels it


async def test_a_manager_that_fails_exits_1() -> None:
    manager = mcr.Manager(mcr.StaticProvider())
    manager.add(Failing())
    assert await run_until_signalled(manager) is ExitCode.FAILED


async def test_the_runner_owns_the_signals_and_a_manager_stopped_by_its_program_exits_0() -> None:
    manager = mcr.Manager(mcr.StaticProvider())
    manager.add(Stopping(manager))
    assert await run_until_signalled(manager) is ExitCode.OK
    assert manager.handle_signals is False
