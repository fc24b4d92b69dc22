"""Run a manager until SIGTERM or SIGINT, drain it within a bound, and say how it ended.

The runner owns the signals (it turns the manager's own handling off) so it
knows a stop was asked for and can bound it. The first signal stops the
manager: intake stops, in-flight reconciles get ``graceful_shutdown_timeout``,
then the provider, the clusters and the leader-election Lease are released.
The whole stop is bounded by that timeout plus :data:`SHUTDOWN_MARGIN`; a
second signal, or a stop that overruns the bound, cancels what is left. A
watchdog thread ends the process if even that cancellation hangs, and another
if, once the manager stopped, the exit waits on threads (``asyncio.to_thread``
work nothing can cancel), so a pod never outlives its
``terminationGracePeriodSeconds`` because of us.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
import threading

from .._manager.manager import Manager
from .errors import ExitCode

log = logging.getLogger("mcruntime.cli")

SHUTDOWN_MARGIN = 10.0
"""Seconds the stop may take beyond the drain: cancelling, stopping clusters, releasing Leases."""
CANCEL_MARGIN = 5.0
"""Seconds cancellation may take after the bound before the watchdog ends the process."""


class _Stop:
    """The signals received so far, and an event the runner waits on."""

    def __init__(self) -> None:
        self.received: list[signal.Signals] = []
        self.requested = asyncio.Event()
        self.forced = asyncio.Event()

    def on_signal(self, signum: int) -> None:
        name = signal.Signals(signum)
        self.received.append(name)
        if len(self.received) == 1:
            log.info("received %s; stopping gracefully (again to stop at once)", name.name)
            self.requested.set()
        else:
            log.warning("received %s again; cancelling what is still running", name.name)
            self.forced.set()


async def run_until_signalled(manager: Manager) -> ExitCode:
    """Start ``manager``; on a signal stop it within the bound. Returns the exit code."""
    stop = _Stop()
    manager.handle_signals = False
    loop = asyncio.get_running_loop()
    installed = []
    for signum in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(signum, stop.on_signal, signum)
            installed.append(signum)
    runner = asyncio.create_task(manager.start(), name="manager")
    try:
        return await _supervise(manager, runner, stop)
    finally:
        for signum in installed:
            loop.remove_signal_handler(signum)


async def _supervise(manager: Manager, runner: asyncio.Task[None], stop: _Stop) -> ExitCode:
    requested = asyncio.create_task(stop.requested.wait())
    try:
        await asyncio.wait({runner, requested}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        requested.cancel()
    if runner.done():  # stopped on its own (or failed) before any signal
        return _outcome(manager, runner, signalled=False)
    manager.stop()
    bound = manager.graceful_shutdown_timeout + SHUTDOWN_MARGIN
    watchdog = threading.Timer(bound + CANCEL_MARGIN, _give_up)
    watchdog.daemon = True
    watchdog.start()
    forced = asyncio.create_task(stop.forced.wait())
    try:
        done, _ = await asyncio.wait({runner, forced}, timeout=bound, return_when=asyncio.FIRST_COMPLETED)
    finally:
        forced.cancel()
    if runner not in done:
        if not stop.forced.is_set():
            log.error("the manager did not stop within %.0fs; cancelling it", bound)
        runner.cancel()
        await asyncio.wait({runner}, timeout=CANCEL_MARGIN)
        watchdog.cancel()
        return ExitCode.DRAIN_TIMEOUT
    watchdog.cancel()
    return _outcome(manager, runner, signalled=True)


def _outcome(manager: Manager, runner: asyncio.Task[None], *, signalled: bool) -> ExitCode:
    error = None if runner.cancelled() else runner.exception()
    if error is not None:
        log.error("the manager failed: %s: %s", type(error).__name__, error, exc_info=error)
        return ExitCode.FAILED
    if signalled and (manager.drained is False or manager.webhook_calls_cut):
        grace = f"{manager.graceful_shutdown_timeout:.0f}s"
        cut = []
        if manager.drained is False:
            cut.append(f"reconciles still running after the {grace} drain were cancelled")
        if manager.webhook_calls_cut:  # each is logged, with its object, as it is answered
            cut.append(
                f"{manager.webhook_calls_cut} webhook call(s) still running after the {grace} drain were "
                "cut short and answered per their on_error"
            )
        log.warning("stopped; %s (exit code %d)", "; ".join(cut), ExitCode.DRAIN_TIMEOUT)
        return ExitCode.DRAIN_TIMEOUT
    log.info("stopped cleanly")
    return ExitCode.OK


def _give_up() -> None:
    """The watchdog: cancellation itself hung; end the process without more waiting."""
    sys.stderr.write("mcruntime: the manager did not stop after cancellation; exiting\n")
    sys.stderr.flush()
    os._exit(ExitCode.DRAIN_TIMEOUT)


def exit_within(seconds: float, code: int) -> None:
    """End the process with ``code`` if its exit has not happened ``seconds`` from now.

    Closing the event loop waits for its executor's threads, and the
    interpreter's exit for every thread that is not a daemon: a handler's
    ``asyncio.to_thread(...)`` call that sleeps on would hold the process past
    the bound the drain kept. The timer is a daemon itself, so an exit that
    comes in time never waits for it.
    """

    def give_up() -> None:
        waiting = sorted(
            thread.name
            for thread in threading.enumerate()
            if thread.is_alive() and not thread.daemon and thread is not threading.main_thread()
        )
        sys.stderr.write(
            f"mcruntime: the manager stopped, but threads still run {seconds:.0f}s later "
            f"({', '.join(waiting) or 'none named'}); exiting without them\n"
        )
        with contextlib.suppress(OSError, ValueError):
            sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)

    timer = threading.Timer(seconds, give_up)
    timer.daemon = True
    timer.start()
