"""Tasks with an owner: everything a cluster or controller starts, it also stops.

A ``TaskSet`` is the structured-concurrency owner of long-running background
work whose members come and go at runtime (one watch per informer, started
lazily), which ``asyncio.TaskGroup`` cannot express: its members must be known
inside one ``async with`` block. Closing the set cancels every member and waits
for each to finish, so nothing outlives its owner.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any, TypeVar

log = logging.getLogger("mcruntime.tasks")
T = TypeVar("T")


class TaskSet:
    """Owns background tasks; ``close`` cancels them all and waits."""

    def __init__(self, owner: str) -> None:
        self.owner = owner
        self._tasks: set[asyncio.Task[Any]] = set()
        self._closed = False

    def spawn(self, coroutine: Coroutine[Any, Any, T], name: str) -> asyncio.Task[T]:
        """Start ``coroutine`` as a member; refuses once the set is closed."""
        if self._closed:
            coroutine.close()
            raise RuntimeError(f"{self.owner} is stopped; cannot start {name}")
        task = asyncio.create_task(coroutine, name=f"{self.owner}:{name}")
        self._tasks.add(task)
        task.add_done_callback(self._finished)
        return task

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
