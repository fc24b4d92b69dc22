"""Liveness renewed from a thread of its own, so a busy event loop cannot starve it.

A replica's event loop may be busy for seconds at a time: engaging a thousand
clusters, replaying their caches, or a reconciler that computes too long.
If the renewal of its peer Lease waited for that loop, the replica would look
dead to its peers while it works normally, and they would take its clusters
only to hand them back a moment later. The :class:`Heartbeat` therefore runs
the renewal on a thread with its own event loop and its own connection to the
hub (never pooled with the main loop's, never behind the main loop's circuit
breaker). The interpreter hands the thread the GIL within its switch interval
(5 ms) however busy the main loop is.

A thread that renews regardless would be lying health: a main loop blocked
for good would keep its clusters forever. So the main loop ticks the
heartbeat (:meth:`Heartbeat.tick`), and the thread renews only while the
last tick is younger than ``stall_limit``. A loop that is slow keeps its
clusters; one that has stopped turning loses them like a dead replica.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING

from .._client.client import Client
from .._client.transport import Transport

if TYPE_CHECKING:
    from .._config.kubeconfig import ClusterConfig

log = logging.getLogger("mcruntime.sharding")

Beat = Callable[[Client], Awaitable[float]]
Connect = Callable[[], AbstractAsyncContextManager[Client]]


@contextlib.asynccontextmanager
async def own_connection(config: ClusterConfig, request_timeout: float) -> AsyncIterator[Client]:
    """A client for ``config`` with a connection of its own (never pooled), closed on exit."""
    transport = Transport(config, "", request_timeout=request_timeout, share_connections=False)
    try:
        yield Client(transport)
    finally:
        await transport.close()


class Heartbeat:
    """Calls ``beat(client)`` on a thread, while the main loop turns.

    ``beat`` runs on the thread's event loop with the client ``connect()``
    opens there (see :func:`own_connection`), and touches the main loop's
    objects only through ``call_soon_threadsafe``. It returns how long after
    its start the next beat is due: the period after a success, ``0`` when it
    has already waited out a backoff. It should log and count its own
    failures; an exception that escapes is logged, and like a beat skipped
    because the main loop stalled, is followed by ``idle`` seconds of rest.
    ``logger`` is the owner's (sharding's or the leader election's), so a
    filter on the owner's logger sees its heartbeat's lines too; ``stalled``
    says what a stalled loop costs, for the warning.
    """

    def __init__(
        self,
        name: str,
        connect: Connect,
        beat: Beat,
        *,
        stall_limit: float,
        idle: float,
        logger: logging.Logger = log,
        stalled: str = "this replica's clusters can move",
    ) -> None:
        self.name = name
        self.log = logger
        self._stalled = stalled
        self._connect = connect
        self._beat = beat
        self._stall_limit = stall_limit
        self._idle = idle
        self._turned = time.monotonic()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[None] | None = None
        self._stop_requested = False
        self.skipped: int = 0
        """Beats skipped because the main loop had not ticked within ``stall_limit``."""

    def __repr__(self) -> str:
        return f"<Heartbeat {self.name!r} running={self.running}>"

    @property
    def running(self) -> bool:
        """Whether the thread is alive (started and not yet finished)."""
        return self._thread is not None and self._thread.is_alive()

    def tick(self) -> None:
        """The main loop is turning: beats may go on for another ``stall_limit``."""
        self._turned = time.monotonic()

    def stalled_for(self) -> float:
        """Seconds since the main loop last ticked."""
        return time.monotonic() - self._turned

    def start(self) -> None:
        """Start (or, after it died, restart) the thread; a running heartbeat is left alone."""
        with self._lock:
            if self.running or self._stop_requested:
                return
            self.tick()
            self._thread = threading.Thread(target=self._run, name=f"mcruntime {self.name}", daemon=True)
            self._thread.start()

    async def stop(self, timeout: float = 10.0) -> None:
        """Stop beating; returns once the thread has closed its connection (or after ``timeout``)."""
        with self._lock:
            self._stop_requested = True
            loop, task, thread = self._loop, self._task, self._thread
        if loop is not None and task is not None:
            with contextlib.suppress(RuntimeError):  # its loop already closed: nothing to cancel
                loop.call_soon_threadsafe(task.cancel)
        if thread is None:
            return
        await asyncio.to_thread(thread.join, timeout)  # join() here would block this loop
        if thread.is_alive():
            self.log.warning("%s: the heartbeat thread did not stop within %gs", self.name, timeout)

    # --- the thread ---------------------------------------------------------------------

    def _run(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException:  # the owner (the main loop's tick) notices and restarts it
            self.log.exception("%s: the heartbeat thread died", self.name)

    async def _main(self) -> None:
        with self._lock:
            if self._stop_requested:
                return
            self._loop = asyncio.get_running_loop()
            self._task = asyncio.current_task()
        try:
            async with self._connect() as client:
                await self._beat_forever(client)
        except asyncio.CancelledError:
            pass
        finally:
            with self._lock:
                self._loop = self._task = None

    async def _beat_forever(self, client: Client) -> None:
        loop = asyncio.get_running_loop()
        warned = False
        while True:
            started = loop.time()
            stalled = self.stalled_for()
            wait = self._idle
            if stalled < self._stall_limit:
                warned = False
                try:
                    wait = await self._beat(client)
                except Exception:
                    self.log.exception("%s: a heartbeat failed", self.name)
            else:
                self.skipped += 1
                if not warned:
                    warned = True
                    self.log.warning(
                        "%s: the event loop has not turned for %.1fs (limit %gs): not renewing, so %s",
                        self.name,
                        stalled,
                        self._stall_limit,
                        self._stalled,
                    )
            await asyncio.sleep(max(0.0, started + wait - loop.time()))  # start to start
