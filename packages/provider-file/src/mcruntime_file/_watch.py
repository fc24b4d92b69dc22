"""Waking the provider when a watched directory changes, with watchfiles.

Directories are watched, never files: an atomic rename over a kubeconfig (how
editors, ``kubectl config`` and the kubelet write) replaces the inode a
per-file watch was attached to, and the watch goes silent. A directory watch
sees the rename, the creation of a file that did not exist, and the
``..data`` symlink swap of a Secret volume alike. Events carry no meaning here:
any of them only says "look again", and the provider compares content. Changes
that touch nothing the provider reads (see :class:`Interest`) are dropped
before they wake it.

Each watch blocks in a thread of its own, on watchfiles' Rust notifier, and
hands the loop nothing but "look again". watchfiles' ``awatch`` would bring
anyio's asyncio backend (about 50 ms of imports on the event loop, right when
the first clusters connect) and a thread hop per step; watchfiles itself is
imported by the first watch thread, off the loop, since a program that
imports this package but starts no provider never needs it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from pathlib import Path

import mcruntime as mcr

from ._interest import Interest
from ._status import printable

log = logging.getLogger("mcruntime.providers.file")

_WAIT_MS = 2000  # the notifier returns at least this often with nothing; the thread then waits again


class DirectoryWatcher:
    """Sets ``changed`` whenever something happens in the wanted directories.

    The wanted set changes as files appear and move (``want``); the watcher
    restarts its watches when it does. ``close`` ends ``run`` promptly: the
    watch threads stop at their next step instead of waiting to be cancelled.
    """

    def __init__(self, changed: asyncio.Event, *, step: float, owner: str, backoff: mcr.Backoff) -> None:
        self._changed = changed
        self._backoff = backoff  # between tries of a watch that failed
        self._step_ms = max(1, int(step * 1000))
        self._group_ms = max(1000, 10 * self._step_ms)  # a writer that never pauses is seen anyway
        self._owner = owner
        self._flat: frozenset[Path] = frozenset()
        self._recursive: frozenset[Path] = frozenset()
        self._interest = Interest()
        self._restart = asyncio.Event()
        self._closed = False
        self.restarts = 0
        self.crashes = 0
        """How often the watcher failed and was started again (a bug's count; 0 is right)."""
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
        """Watch until closed, restarting whenever the wanted directories change, or after a failure.

        A failure here is a bug, not a vanished root (each watch retries those
        itself); it must not end the watching in silence and leave changes to
        the periodic rescan, so it is logged and the watches start again.
        """
        loop = asyncio.get_running_loop()
        failures = 0
        while not self._closed:
            stop = asyncio.Event()
            self._restart = stop
            flat, recursive = self._flat, self._recursive
            started = loop.time()
            try:
                async with asyncio.TaskGroup() as watches:
                    for roots, deep in ((flat, False), (recursive, True)):
                        if roots:
                            watches.create_task(self._watch(roots, deep, stop), name=f"{self._owner}:watch")
                    watches.create_task(stop.wait(), name=f"{self._owner}:watch-restart")
            except Exception:
                failures = failures_after(failures, loop.time() - started)
                self.crashes += 1
                delay = self._backoff.delay(failures - 1)
                log.error(
                    "%s: the directory watcher failed; it starts again in %.1fs, and until then only "
                    "the periodic rescan sees changes",
                    self._owner,
                    delay,
                    exc_info=True,
                )
                self._changed.set()  # look now: a change may have come while it failed
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(delay):
                        await stop.wait()  # close() and want() end the wait early
                continue
            self.restarts += 1

    async def _watch(self, roots: frozenset[Path], recursive: bool, stop: asyncio.Event) -> None:
        loop = asyncio.get_running_loop()
        failures = 0
        while not stop.is_set():
            halt = threading.Event()
            ended: asyncio.Future[None] = loop.create_future()
            watching = threading.Thread(
                target=self._watch_thread,
                args=(loop, ended, sorted(map(str, roots)), recursive, halt),
                name=f"{self._owner}:watch",
                daemon=True,
            )
            watching.start()
            started = loop.time()
            stopping = asyncio.ensure_future(stop.wait())
            try:
                await asyncio.wait((ended, stopping), return_when=asyncio.FIRST_COMPLETED)
            finally:
                # Stopped, cancelled or failed: the thread sees ``halt`` at its next step and
                # ends; wait for it, so that no watch outlives its owner.
                halt.set()
                stopping.cancel()
                await asyncio.wait((ended,))
                # ``ended`` is the thread's last act, but the thread is still alive while it
                # returns: joining takes no longer than that return, and afterwards no
                # watch thread of this owner is left for anyone to see.
                watching.join()
            error = ended.exception()
            if error is None:
                return
            where = sorted(map(str, roots))
            failures = failures_after(failures, loop.time() - started)
            level = logging.WARNING if failures == 1 else logging.DEBUG  # rescans go on meanwhile
            why = printable(str(error))  # may quote a path: no line breaks or escapes from a file name
            log.log(level, "%s: watching %s failed (%s); retrying", self._owner, where, why)
            self._changed.set()  # the next pass sees what changed and asks for other roots
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._backoff.delay(failures - 1)):
                    await stop.wait()

    def _watch_thread(
        self,
        loop: asyncio.AbstractEventLoop,
        ended: asyncio.Future[None],
        roots: list[str],
        recursive: bool,
        halt: threading.Event,
    ) -> None:
        """Watch ``roots`` until ``halt`` is set, in a thread of its own reaching the loop by callbacks."""
        error: BaseException | None = None
        try:
            from watchfiles._rust_notify import RustNotify  # watchfiles' documented Rust backend

            with RustNotify(roots, False, False, 300, recursive, True) as notifier:
                # Registered now: look again, so that nothing written before the watch began is missed.
                loop.call_soon_threadsafe(self._changed.set)
                while True:
                    changes = notifier.watch(self._group_ms, self._step_ms, _WAIT_MS, halt)
                    if changes == "stop":
                        return
                    if isinstance(changes, set) and changes:
                        interest = self._interest  # replaced whole by ``want``, never changed in place
                        relevant = sum(1 for change, path in changes if interest(change, path))
                        loop.call_soon_threadsafe(self._seen, relevant, len(changes) - relevant)
        except Exception as failure:  # a root vanished between the scan and the watch, say
            error = failure
        finally:
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits any more
                loop.call_soon_threadsafe(_settle, ended, error)

    def _seen(self, relevant: int, ignored: int) -> None:
        self.ignored += ignored
        if relevant:
            self._changed.set()


HEALTHY_WATCH = 60.0
"""Seconds a watch must have run for its failure to count as a first one again."""


def failures_after(failures: int, ran_for: float) -> int:
    """The failure count once a watch that ran ``ran_for`` seconds has failed.

    A watch that worked for a while and then failed is a new trouble, not the
    next step of the last one: it is logged at WARNING and retried after the
    backoff's first delay. A watch that keeps failing soon after it starts
    backs off further each time, up to the backoff's cap.
    """
    return 1 if ran_for >= HEALTHY_WATCH else failures + 1


def _settle(ended: asyncio.Future[None], error: BaseException | None) -> None:
    if ended.done():
        return
    if error is None:
        ended.set_result(None)
    else:
        ended.set_exception(error)
