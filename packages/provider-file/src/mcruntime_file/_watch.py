"""Waking the provider when a watched directory changes, with watchfiles.

Directories are watched, never files: an atomic rename over a kubeconfig (how
editors, ``kubectl config`` and the kubelet write) replaces the inode a
per-file watch was attached to, and the watch goes silent. A directory watch
sees the rename, the creation of a file that did not exist, and the
``..data`` symlink swap of a Secret volume alike. Events carry no meaning here:
any of them only says "look again", and the provider compares content. Changes
that touch nothing the provider reads (see :class:`Interest`) are dropped
before they wake it.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

from watchfiles import Change, awatch

from ._interest import Interest

log = logging.getLogger("mcruntime.providers.file")

_RETRY_AFTER = 2.0  # seconds before a watch that failed to start is tried again


class DirectoryWatcher:
    """Sets ``changed`` whenever something happens in the wanted directories.

    The wanted set changes as files appear and move (``want``); the watcher
    restarts its watches when it does. ``close`` ends ``run`` promptly: the
    watch threads stop at their next step instead of waiting to be cancelled.
    """

    def __init__(self, changed: asyncio.Event, *, step: float, owner: str) -> None:
        self._changed = changed
        self._step_ms = max(1, int(step * 1000))
        self._group_ms = max(1000, 10 * self._step_ms)  # a writer that never pauses is seen anyway
        self._owner = owner
        self._flat: frozenset[Path] = frozenset()
        self._recursive: frozenset[Path] = frozenset()
        self._interest = Interest()
        self._restart = asyncio.Event()
        self._closed = False
        self.restarts = 0
        self.ignored = 0
        """Changes dropped as touching nothing the provider reads."""

    def want(self, flat: frozenset[Path], recursive: frozenset[Path], interest: Interest) -> None:
        """Watch these directories (their entries; everything below for ``recursive``) from now on.

        Only changes ``interest`` accepts wake the provider; it applies at once, without a restart.
        """
        self._interest = interest
        if (flat, recursive) != (self._flat, self._recursive):
            self._flat, self._recursive = flat, recursive
            self._restart.set()

    def close(self) -> None:
        """Stop watching; ``run`` returns shortly after."""
        self._closed = True
        self._restart.set()

    async def run(self) -> None:
        """Watch until closed, restarting whenever the wanted directories change."""
        while not self._closed:
            stop = asyncio.Event()
            self._restart = stop
            flat, recursive = self._flat, self._recursive
            async with asyncio.TaskGroup() as watches:
                for roots, deep in ((flat, False), (recursive, True)):
                    if roots:
                        watches.create_task(self._watch(roots, deep, stop), name=f"{self._owner}:watch")
                watches.create_task(stop.wait(), name=f"{self._owner}:watch-restart")
            self.restarts += 1

    async def _watch(self, roots: frozenset[Path], recursive: bool, stop: asyncio.Event) -> None:
        loop = asyncio.get_running_loop()
        failures = 0
        while not stop.is_set():
            # The watch is registered synchronously when the loop below first steps, so this look
            # again runs after it: whatever changed while no watch was in place is not missed.
            loop.call_soon(self._changed.set)
            try:
                async for _changes in awatch(
                    *sorted(roots),
                    watch_filter=self._relevant,
                    debounce=self._group_ms,
                    step=self._step_ms,
                    stop_event=stop,
                    rust_timeout=2000,
                    recursive=recursive,
                    ignore_permission_denied=True,
                ):
                    self._changed.set()
                return
            except Exception as error:  # a root vanished between the scan and the watch, say
                where = sorted(map(str, roots))
                failures += 1
                level = logging.WARNING if failures == 1 else logging.DEBUG  # rescans go on meanwhile
                log.log(level, "%s: watching %s failed (%s); retrying", self._owner, where, error)
                self._changed.set()  # the next pass sees what changed and asks for other roots
                try:
                    async with asyncio.timeout(_RETRY_AFTER):
                        await stop.wait()
                except TimeoutError:
                    pass

    def _relevant(self, change: Change, path: str) -> bool:
        if self._interest(change, path):
            return True
        self.ignored += 1
        return False
