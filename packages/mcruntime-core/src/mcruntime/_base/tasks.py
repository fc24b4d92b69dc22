"""Tasks with an owner: everything a cluster or controller starts, it also stops.

A ``TaskSet`` is the structured-concurrency owner of long-running background
work whose members come and go at runtime (one watch per informer, started
lazily), which ``asyncio.TaskGroup`` cannot express: its members must be known
inside one ``async with`` block. Closing the set cancels every member and waits
for each to finish, so nothing outlives its owner.

Long-lived loops are started with :meth:`TaskSet.supervise`: a loop that dies
unexpectedly is logged with its traceback, counted, shown (``failing()``, read
by health checks) and started again after the one capped backoff. Nothing a
cluster or the manager runs for its whole life may die silently.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar

from .backoff import DEFAULT_BACKOFF, Backoff

log = logging.getLogger("mcruntime.tasks")
T = TypeVar("T")

CrashListener = Callable[[str, BaseException], None]
"""Told ``(loop name, error)`` each time a supervised loop dies; must be cheap and not raise."""

# A loop that ran this long before dying starts its backoff afresh: it was not crash-looping.
_HEALTHY_RUN = 60.0


@dataclass
class LoopStatus:
    """A supervised loop's record: how often it died, why last, and whether it is down now."""

    name: str
    crashes: int = 0
    last_error: str | None = None
    last_crash_at: float | None = None
    restarting: bool = False
    """Dead and waiting out its backoff before the next start."""


class TaskSet:
    """Owns background tasks; ``close`` cancels them all and waits."""

    def __init__(self, owner: str) -> None:
        self.owner = owner
        self._tasks: set[asyncio.Task[Any]] = set()
        self._closed = False
        self._loops: dict[str, LoopStatus] = {}
        self.crash_listeners: list[CrashListener] = []

    def spawn(self, coroutine: Coroutine[Any, Any, T], name: str) -> asyncio.Task[T]:
        """Start ``coroutine`` as a member; refuses once the set is closed."""
        if self._closed:
            coroutine.close()
            raise RuntimeError(f"{self.owner} is stopped; cannot start {name}")
        task = asyncio.create_task(coroutine, name=f"{self.owner}:{name}")
        self._tasks.add(task)
        task.add_done_callback(self._finished)
        return task

    def supervise(
        self,
        factory: Callable[[], Coroutine[Any, Any, object]],
        name: str,
        *,
        backoff: Backoff = DEFAULT_BACKOFF,
    ) -> asyncio.Task[None]:
        """Run ``factory()`` as a member and start it again whenever it raises.

        A loop is meant to run until cancelled: if it returns, it is done; if
        it raises, the error is logged with its traceback, recorded in
        :meth:`loops` and told to ``crash_listeners`` (metrics), and the loop
        starts again after ``backoff`` (consecutive crashes back off further,
        up to its cap). Cancelling the returned task (or closing the set) ends it.
        """
        status = self._loops.setdefault(name, LoopStatus(name))
        return self.spawn(self._keep_running(factory, status, backoff), name)

    async def _keep_running(
        self, factory: Callable[[], Coroutine[Any, Any, object]], status: LoopStatus, backoff: Backoff
    ) -> None:
        failures = 0
        try:
            while True:
                started = time.monotonic()
                try:
                    await factory()
                    return
                except asyncio.CancelledError:
                    raise
                except Exception as error:
                    if time.monotonic() - started >= _HEALTHY_RUN:
                        failures = 0
                    status.crashes += 1
                    status.last_error = f"{type(error).__name__}: {error}"
                    status.last_crash_at = time.time()
                    status.restarting = True
                    delay = backoff.delay(failures)
                    failures += 1
                    log.error(
                        "%s: loop %s died (crash %d); restarting in %.1fs",
                        self.owner,
                        status.name,
                        status.crashes,
                        delay,
                        exc_info=error,
                    )
                    for listener in list(self.crash_listeners):
                        try:
                            listener(status.name, error)
                        except Exception:
                            log.exception("%s: a crash listener failed", self.owner)
                    await asyncio.sleep(delay)
                    status.restarting = False
        finally:
            status.restarting = False

    def loops(self) -> list[LoopStatus]:
        """Every supervised loop started in this set, with its crash record."""
        return list(self._loops.values())

    def failing(self) -> list[LoopStatus]:
        """The supervised loops that are dead now, waiting to be restarted."""
        return [status for status in self._loops.values() if status.restarting]

    def forget_loop(self, name: str) -> None:
        """Drop the record of a loop that will not run again (its subject is gone)."""
        self._loops.pop(name, None)

    def _finished(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("%s: task %s failed", self.owner, task.get_name(), exc_info=task.exception())

    def __len__(self) -> int:
        return len(self._tasks)

    @property
    def closed(self) -> bool:
        return self._closed

    async def close(self) -> None:
        """Cancel every member and wait until all have finished.

        A member that swallows its cancellation (third-party code does) is
        cancelled again every second, with a warning, rather than blocking its
        owner's shutdown forever.
        """
        self._closed = True
        while self._tasks:
            pending = list(self._tasks)
            for task in pending:
                task.cancel()
            _done, still = await asyncio.wait(pending, timeout=1.0)
            for task in still:
                log.warning(
                    "%s: task %s ignored cancellation; cancelling it again", self.owner, task.get_name()
                )
