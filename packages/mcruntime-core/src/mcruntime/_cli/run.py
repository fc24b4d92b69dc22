"""``mcruntime run TARGET``: build the manager, then run it until a signal (or only check it)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
from collections.abc import Callable

from .._manager.settings import ManagerSettings, misspelled_variables
from .check import describe, problems
from .commands import Command
from .common import add_target_arguments, load_manager, prepare
from .errors import ExitCode, UsageError
from .runner import CANCEL_MARGIN, SHUTDOWN_MARGIN, exit_within, run_until_signalled

log = logging.getLogger("mcruntime.cli")

DESCRIPTION = f"""\
Import the target, build its Manager with the settings below, and run it until
SIGTERM or SIGINT. The first signal drains: in-flight reconciles get
--graceful-shutdown-timeout seconds, then clusters stop and Leases are released;
the whole stop is bounded by that timeout plus {SHUTDOWN_MARGIN:.0f}s. A second signal stops at once.

exit codes: 0 stopped cleanly (or --check passed); 1 the manager failed;
2 bad flag, variable or target, nothing started; 3 the drain hit its bound."""


def configure(parser: argparse.ArgumentParser) -> None:
    add_target_arguments(parser)
    parser.add_argument(
        "--check",
        action="store_true",
        help="build the manager, print what it would run, validate it and exit without connecting",
    )


def execute(arguments: argparse.Namespace) -> int:
    settings, flags = prepare(arguments)
    with asyncio.Runner(loop_factory=loop_factory(settings.event_loop)) as runner:
        code = runner.run(_run(arguments, settings, flags))
        if not arguments.check:  # what is left (closing the loop, the exit) may wait on threads
            exit_within(CANCEL_MARGIN, code)
    return code


def loop_factory(name: str) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """The event loop ``--event-loop`` names: ``None`` is asyncio's own.

    uvloop is imported only when chosen; the settings checked it is installed.
    """
    if name != "uvloop":
        return None
    import uvloop

    return uvloop.new_event_loop


async def _run(
    arguments: argparse.Namespace, settings: ManagerSettings, flags: dict[str, object]
) -> ExitCode:
    log.debug("event loop: %s", type(asyncio.get_running_loop()).__module__)
    manager = await load_manager(arguments, settings)
    found = problems(manager, flags, settings) + misspelled_variables(os.environ)
    if arguments.check:
        for line in describe(manager):
            print(line)
        if found:
            raise UsageError("check failed: " + "; ".join(found))
        print(f"ok: {arguments.target}")
        return ExitCode.OK
    for problem in found:  # flags the factory ignored among them: one warning, not two
        log.warning("%s", problem)
    return await run_until_signalled(manager)


COMMAND = Command(
    name="run",
    help="run a manager until SIGTERM/SIGINT (or --check it)",
    configure=configure,
    execute=execute,
    description=DESCRIPTION,
)
