"""A start's outcome, for whoever waits on it: started, or why not.

``Manager.wait_started`` used to wait on an event that only a successful start
set, so a start that failed (a port taken, a missing extra) left the waiter
hanging forever while the error sat in a task nobody awaited.
"""

from __future__ import annotations

import asyncio

PROVIDER_RETURNED = (
    "the provider's run() returned while the manager runs: %s engages and disengages no more "
    "clusters from now on (the %d engaged stay); a provider's run() is to run until cancelled"
)
"""Logged at WARNING: the manager goes on, but discovery stopped, and nothing else would say so."""


class StartLatch:
    """Set once a start has started everything; or ended, with its error if it failed."""

    def __init__(self) -> None:
        self.started = asyncio.Event()
        self._ended = asyncio.Event()
        self._error: BaseException | None = None

    def begin(self) -> None:
        """A new start: forget how the last one ended."""
        self._ended.clear()
        self._error = None

    def failed(self, error: BaseException) -> None:
        """The start raised before it had started: waiters get ``error``."""
        if not self.started.is_set():
            self._error = error
            self._ended.set()

    def ended(self) -> None:
        self._ended.set()

    async def wait(self) -> None:
        """Return once started; raise the start's error (or say it stopped) if it ended first."""
        if not self.started.is_set():
            waits = [asyncio.ensure_future(self.started.wait()), asyncio.ensure_future(self._ended.wait())]
            try:
                await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for wait in waits:
                    wait.cancel()
        if self.started.is_set():
            return
        if self._error is not None:
            raise self._error
        raise RuntimeError("the manager stopped before it started")
