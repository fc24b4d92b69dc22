"""What a running manager watches: the provider's run and every Runnable's, late ones too.

The set of watched tasks used to be taken once, when the manager started, so a
Runnable added with ``Manager.add`` after the start could crash unseen: nothing
stopped the manager, and its error was thrown away at shutdown. A task watched
here is seen however late it came.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

log = logging.getLogger("mcruntime.manager")


class RunWatch:
    """The tasks whose failure stops the manager, open to additions while it waits."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[None]] = set()
        self._added = asyncio.Event()

    def watch(self, task: asyncio.Task[None]) -> None:
        self._tasks.add(task)
        self._added.set()

    async def until(self, stop: asyncio.Event, returned: Callable[[asyncio.Task[None]], None]) -> None:
        """Wait for ``stop``; raise the first watched task's error, logged with its name.

        ``returned`` hears of a task that ended without an error before ``stop``.
        """
        stop_waiter = asyncio.ensure_future(stop.wait())
        try:
            while not stop.is_set():
                self._added.clear()
                added = asyncio.ensure_future(self._added.wait())
                try:
                    done, _pending = await asyncio.wait(
                        {stop_waiter, added, *self._tasks}, return_when=asyncio.FIRST_COMPLETED
                    )
                finally:
                    added.cancel()
                for task in done:
                    if task is stop_waiter or task is added:
                        continue
                    self._tasks.discard(task)
                    if task.cancelled():
                        continue
                    error = task.exception()
                    if error is not None:
                        log.error("%s failed; shutting down", task.get_name(), exc_info=error)
                        raise error
                    returned(task)  # type: ignore[arg-type]
        finally:
            stop_waiter.cancel()
