"""The work queue between a controller's event handlers and its workers, fair across clusters.

Event handlers add keys (reconcile requests); workers take them with ``get``,
reconcile, and call ``done``. The queue guarantees what a controller relies on:

* a key waiting to be processed is held once, however often it is added;
* a key is never handed to two workers at once: a key added while a worker has
  it is held back and queued again when that worker calls ``done``;
* failures are retried after a delay from a rate limiter (``add_rate_limited``),
  and reconcilers can ask to run again later (``add_after``);
* clusters share the workers fairly: keys are grouped (by the key's ``cluster``
  by default) and groups take turns of at most ``keys_per_turn`` keys, so a
  cluster with ten thousand pending keys does not starve one with ten;
* a group can be held to a limit of keys in processing (``group_limit``): a
  group at its limit is passed over by ``get`` until one of its keys is done,
  so a cluster whose reconciles hang occupies its own lane and no other;
* when a cluster leaves the fleet, ``purge`` drops its keys instead of retrying
  them forever.

It runs on one asyncio event loop and is not thread-safe: call it from
coroutines and callbacks of that loop only.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Callable, Hashable
from typing import Generic, Protocol, TypeVar

from .._base.errors import MCRuntimeError
from .ratelimit import RateLimiter, default_rate_limiter

__all__ = ["NoMetrics", "QueueMetrics", "QueueShutDown", "WorkQueue"]

K = TypeVar("K", bound=Hashable)


class QueueShutDown(MCRuntimeError):
    """``WorkQueue.get`` found the queue shut down with no key left: the worker should stop."""


class QueueMetrics(Protocol):
    """Receives the queue's events, for a metrics layer (Prometheus, logs) to count.

    The queue calls these synchronously on its event loop, so they must be cheap
    and must not raise. Gauges are read from the queue rather than pushed:
    ``len(queue)`` and ``WorkQueue.depth_by_group()`` give the depth, and
    ``WorkQueue.longest_processing_seconds()`` the age of the oldest unfinished
    work (a stuck worker shows up there long before it finishes).
    """

    def on_add(self, key: Hashable, group: Hashable) -> None:
        """``key`` was accepted for processing (not reported when deduplicated or dropped)."""
        ...

    def on_get(self, key: Hashable, group: Hashable, waited: float) -> None:
        """A worker took ``key``, ``waited`` seconds after it became ready."""
        ...

    def on_done(self, key: Hashable, group: Hashable, processing: float) -> None:
        """A worker finished ``key`` after ``processing`` seconds."""
        ...

    def on_retry(self, key: Hashable, group: Hashable) -> None:
        """``key`` was scheduled for a rate-limited retry."""
        ...


class NoMetrics:
    """The default ``QueueMetrics``: records nothing."""

    def on_add(self, key: Hashable, group: Hashable) -> None:
        """Record nothing."""

    def on_get(self, key: Hashable, group: Hashable, waited: float) -> None:
        """Record nothing."""

    def on_done(self, key: Hashable, group: Hashable, processing: float) -> None:
        """Record nothing."""

    def on_retry(self, key: Hashable, group: Hashable) -> None:
        """Record nothing."""


def _cluster_of(key: Hashable) -> Hashable:
    """The default group: the key's ``cluster`` attribute, or ``""`` for keys without one."""
    cluster: Hashable = getattr(key, "cluster", "")
    return cluster


class WorkQueue(Generic[K]):
    """A deduplicating, rate-limited, delaying queue of keys, fair between groups of keys.

    Each key is *ready* (queued, waiting for a worker), *processing* (a worker
    took it and has not called ``done`` yet), or neither. Adding a ready key
    changes nothing. Adding a processing key marks it to run again: it becomes
    ready when its worker calls ``done``, at the back of its group's line.
    Every ``get`` must be paired with one ``done``.

    Ready keys wait in one first-in, first-out line per group, and ``get`` serves
    the groups that have ready keys in turn, up to ``keys_per_turn`` keys each.
    Within a group keys come out in the order they became ready. With
    ``group_limit``, a group that holds that many keys in processing sits out
    (its ready keys wait) until a worker calls ``done`` for one of them; it then
    goes on with its turn if that was unfinished, or rejoins the back of the turns.

    Delayed keys (``add_after``, ``add_rate_limited``) wait on the event loop's
    timers and are added when their time comes; waiting for a delay is separate
    from being ready, so a key can be ready now and also due again later.

    Args:
        group: maps a key to its group; by default the key's ``cluster``
            attribute, or ``""`` when it has none (one group for all).
        rate_limiter: decides the delay of ``add_rate_limited``; by default
            ``default_rate_limiter()``.
        metrics: receives add/get/done/retry events; by default nothing does.
        group_limit: the most keys of one group in processing at once; ``None``
            (the default) sets no limit. This is what keeps one hung cluster
            from taking every worker: its reconciles fill its own lane only.
        keys_per_turn: the most keys a group is handed in a row while other
            groups have keys ready (1 by default). A larger turn sends the
            requests of one cluster's reconciles together, which costs its
            API server less per request than requests spread over every
            cluster in turn; another group then waits at most this many keys
            per group ahead of it.
        clock: monotonic seconds used to time waits and processing for
            ``metrics`` and ``longest_processing_seconds``. Delays always run on
            the event loop's own clock.
    """

    def __init__(
        self,
        *,
        group: Callable[[K], Hashable] = _cluster_of,
        rate_limiter: RateLimiter | None = None,
        metrics: QueueMetrics | None = None,
        group_limit: int | None = None,
        keys_per_turn: int = 1,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if group_limit is not None and group_limit < 1:
            raise ValueError(f"WorkQueue group_limit must be at least 1 (or None), not {group_limit}")
        if keys_per_turn < 1:
            raise ValueError(f"WorkQueue keys_per_turn must be at least 1, not {keys_per_turn}")
        self._group_of = group
        self._group_limit = group_limit
        self._keys_per_turn = keys_per_turn
        self._rate_limiter: RateLimiter = default_rate_limiter() if rate_limiter is None else rate_limiter
        self._metrics: QueueMetrics = NoMetrics() if metrics is None else metrics
        self._clock = clock
        # Ready keys, one FIFO of (key, time it became ready) per group with ready keys.
        self._ready: dict[Hashable, deque[tuple[K, float]]] = {}
        # The groups with ready keys that may be served now, in the order they will be.
        self._turns: deque[Hashable] = deque()
        # Groups with ready keys that sit out: they hold ``group_limit`` keys in processing.
        # Every group in ``_ready`` is in exactly one of ``_turns`` and ``_parked``.
        self._parked: set[Hashable] = set()
        # Keys handed out in each unfinished turn, per group: the group at the front of
        # ``_turns``, a parked group that reached its limit mid-turn (it goes back to the
        # front when a key of its own is done), and a group such a return went ahead of.
        self._served: dict[Hashable, int] = {}
        # Keys in processing per group (only groups with any).
        self._busy: dict[Hashable, int] = {}
        self._ready_count = 0
        # Keys that must be processed: every ready key, plus processing keys added again.
        self._needs_processing: set[K] = set()
        # Keys workers hold, with when they were taken and their group; oldest first.
        self._processing: dict[K, tuple[float, Hashable]] = {}
        # Processing keys whose group was purged: their retries are dropped until they are done.
        self._purged_processing: set[K] = set()
        # Keys waiting for a delay: when they are due (loop time) and their timer.
        self._delayed: dict[K, tuple[float, asyncio.TimerHandle]] = {}
        self._getters: deque[asyncio.Future[None]] = deque()
        self._drain_waiters: list[asyncio.Future[None]] = []
        self._shutting_down = False

    def set_metrics(self, metrics: QueueMetrics) -> None:
        """Attach a metrics hook after construction (the manager does, when it adopts a controller)."""
        self._metrics = metrics

    # -- adding ---------------------------------------------------------------------

    def add(self, key: K) -> None:
        """Mark ``key`` for processing; does nothing if it already is, or after shutdown.

        A key no worker holds becomes ready at the back of its group's line. A
        key a worker holds becomes ready when that worker calls ``done``.
        """
        # A held key of a purged group may be added again: its group came back (a cluster
        # re-engaged, or was replaced) while the old engagement's reconcile still runs. The new
        # engagement sees the key once that reconcile is done; only the old one's retries
        # (add_after, add_rate_limited) are dropped.
        if self._shutting_down or key in self._needs_processing:
            return
        group = self._group_of(key)
        self._needs_processing.add(key)
        self._metrics.on_add(key, group)
        if key not in self._processing:
            self._make_ready(key, group)

    def add_after(self, key: K, delay: float) -> None:
        """Add ``key`` once ``delay`` seconds have passed; at once if ``delay`` <= 0.

        If ``key`` is already waiting for a delay, whichever is due first wins: an
        earlier time replaces the pending one, a later one is ignored. Needs a
        running event loop when ``delay`` > 0. Ignored after shutdown.
        """
        if self._shutting_down or key in self._purged_processing:
            return
        if not delay > 0:
            self.add(key)
            return
        loop = asyncio.get_running_loop()
        due = loop.time() + delay
        pending = self._delayed.get(key)
        if pending is not None:
            pending_due, pending_timer = pending
            if pending_due <= due:
                return
            pending_timer.cancel()
        self._delayed[key] = (due, loop.call_at(due, self._delay_over, key))

    def add_rate_limited(self, key: K) -> None:
        """Retry ``key`` after the rate limiter's delay; each call counts as one more failure.

        Call ``forget`` once the key succeeds, so its next failure starts the
        backoff afresh. Ignored after shutdown.
        """
        if self._shutting_down or key in self._purged_processing:
            return
        self._metrics.on_retry(key, self._group_of(key))
        self.add_after(key, self._rate_limiter.when(key))

    def forget(self, key: K) -> None:
        """Reset ``key``'s backoff (it succeeded); does not remove it from the queue."""
        self._rate_limiter.forget(key)

    def num_requeues(self, key: K) -> int:
        """How many rate-limited retries ``key`` has had since it was last forgotten."""
        return self._rate_limiter.retries(key)

    # -- processing -----------------------------------------------------------------

    async def get(self, *, ahead: bool = False) -> K:
        """Wait for a ready key and hand it to the caller, who must call ``done`` with it.

        Groups with ready keys take turns; a group at its ``group_limit`` is
        passed over. After shutdown the keys still ready are handed out first
        (a parked group's keys once its held keys are done). Waiting callers
        are served in the order they came, except that ``ahead=True`` goes to
        the front of that line: a controller's idle worker is served before
        its dispatcher.

        Raises:
            QueueShutDown: the queue is shut down and no key is ready.
        """
        while not self._turns:
            if self._shutting_down and not self._ready_count:
                raise QueueShutDown("the work queue is shut down")
            woken: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            if ahead:
                self._getters.appendleft(woken)
            else:
                self._getters.append(woken)
            try:
                await woken
            except asyncio.CancelledError:
                if woken.done() and not woken.cancelled():
                    # Woken for a key, then cancelled before taking it: pass the key on.
                    self._wake_one_getter()
                else:
                    with contextlib.suppress(ValueError):
                        self._getters.remove(woken)
                raise
        return self._take_next()

    def get_nowait(self) -> K | None:
        """A ready key, as :meth:`get` would hand it out, or ``None`` if none is ready now.

        For a worker that has just finished a key and would rather go on with
        the next than wait: the lanes, their limits and the round robin are the
        same as for :meth:`get`, and the caller must call ``done`` with the key.
        """
        return self._take_next() if self._turns else None

    def done(self, key: K) -> None:
        """Tell the queue a worker has finished ``key`` (successfully or not).

        If ``key`` was added again while it was processed, it becomes ready now,
        unless its group was purged meanwhile.

        Raises:
            ValueError: no worker holds ``key`` (``done`` twice, or without ``get``).
        """
        taken = self._processing.pop(key, None)
        if taken is None:
            raise ValueError(f"done({key!r}) but no worker holds that key")
        started, group = taken
        busy = self._busy[group] - 1
        if busy:
            self._busy[group] = busy
        else:
            del self._busy[group]
        self._metrics.on_done(key, group, self._clock() - started)
        self._purged_processing.discard(key)
        if key in self._needs_processing:  # added again, since the purge if its group was purged
            self._make_ready(key, group)
        if group in self._parked and not self._at_limit(group):
            self._parked.discard(group)
            if group in self._served:  # back to the front to finish its turn
                self._turns.appendleft(group)
            else:
                self._turns.append(group)
            self._wake_one_getter()
        self._release_idle_getters()
        if not self._processing:
            for waiter in self._drain_waiters:
                if not waiter.done():
                    waiter.set_result(None)

    # -- removing -------------------------------------------------------------------

    def purge(self, group: Hashable) -> int:
        """Drop every ready and delayed key of ``group`` and forget their backoff.

        For a cluster that left the fleet: its requests must not be retried
        forever. Keys of ``group`` that workers hold stay theirs until ``done``,
        and their retries (``add_after``, ``add_rate_limited``: the old
        engagement's) are dropped. A plain ``add`` after the purge is the group's
        new work (the cluster came back, or was replaced): it is accepted as
        usual, and a key still held then is handed out again once it is done.

        Returns:
            How many distinct keys were dropped from the ready lines and delays.
        """
        dropped: set[K] = set()
        line = self._ready.pop(group, None)
        self._served.pop(group, None)
        if line is not None:
            if group in self._parked:
                self._parked.discard(group)
            else:
                self._turns.remove(group)
            self._ready_count -= len(line)
            dropped.update(key for key, _ in line)
        for key in [key for key in self._delayed if self._group_of(key) == group]:
            _, timer = self._delayed.pop(key)
            timer.cancel()
            dropped.add(key)
        held = [key for key, (_, key_group) in self._processing.items() if key_group == group]
        self._purged_processing.update(held)
        for key in [*dropped, *held]:
            self._needs_processing.discard(key)
            self._rate_limiter.forget(key)
        self._release_idle_getters()
        return len(dropped)

    def shut_down(self) -> None:
        """Stop accepting keys: adds are ignored, pending delays cancelled, idle getters woken.

        Keys already ready are still handed out, and a held key that was added
        again still becomes ready when it is done; ``get`` raises
        ``QueueShutDown`` once nothing is ready. Safe to call more than once.
        """
        self._shutting_down = True
        for _, timer in self._delayed.values():
            timer.cancel()
        self._delayed.clear()
        while self._getters:
            getter = self._getters.popleft()
            if not getter.done():
                getter.set_result(None)

    async def shut_down_with_drain(self, timeout: float | None = None) -> bool:
        """Shut down, then wait until workers have called ``done`` for every key they hold.

        Args:
            timeout: the most seconds to wait; ``None`` waits as long as it takes.

        Returns:
            True if no key was held any more, False if the timeout passed first.
        """
        self.shut_down()
        if not self._processing:
            return True
        drained: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._drain_waiters.append(drained)
        try:
            async with asyncio.timeout(timeout):
                await drained
        except TimeoutError:
            return False
        finally:
            self._drain_waiters.remove(drained)
        return True

    # -- reading --------------------------------------------------------------------

    def __len__(self) -> int:
        """The number of ready keys (neither held by a worker nor waiting for a delay)."""
        return self._ready_count

    def depth_by_group(self) -> dict[Hashable, int]:
        """Ready keys per group, for groups that have any."""
        return {group: len(line) for group, line in self._ready.items()}

    @property
    def processing_count(self) -> int:
        """The number of keys workers hold."""
        return len(self._processing)

    def processing_by_group(self) -> dict[Hashable, int]:
        """Keys workers hold per group, for groups that hold any."""
        return dict(self._busy)

    @property
    def group_limit(self) -> int | None:
        """The most keys of one group in processing at once (``None``: no limit)."""
        return self._group_limit

    @property
    def keys_per_turn(self) -> int:
        """The most keys a group is handed in a row while others have keys ready."""
        return self._keys_per_turn

    @property
    def delayed_count(self) -> int:
        """The number of keys waiting for a delay (``add_after``, ``add_rate_limited``)."""
        return len(self._delayed)

    @property
    def shutting_down(self) -> bool:
        """Whether ``shut_down`` has been called."""
        return self._shutting_down

    def longest_processing_seconds(self) -> float:
        """How long the longest-held key has been processing; 0 if none is.

        The "unfinished work" gauge: it grows while a worker is stuck.
        """
        for started, _ in self._processing.values():  # insertion order: the oldest first
            return self._clock() - started
        return 0.0

    def processing(self) -> list[tuple[K, float, float]]:
        """Each key a worker holds, when it was taken (the queue's clock) and for how long; oldest first."""
        now = self._clock()
        return [(key, started, now - started) for key, (started, _group) in self._processing.items()]

    # -- internals ------------------------------------------------------------------

    def _at_limit(self, group: Hashable) -> bool:
        return self._group_limit is not None and self._busy.get(group, 0) >= self._group_limit

    def _make_ready(self, key: K, group: Hashable) -> None:
        line = self._ready.get(group)
        if line is None:
            line = self._ready[group] = deque()
            if self._at_limit(group):
                self._parked.add(group)
            else:
                self._turns.append(group)
        line.append((key, self._clock()))
        self._ready_count += 1
        if group not in self._parked:
            self._wake_one_getter()

    def _take_next(self) -> K:
        group = self._turns[0]
        line = self._ready[group]
        key, ready_since = line.popleft()
        self._busy[group] = self._busy.get(group, 0) + 1
        served = self._served.get(group, 0) + 1
        if not line:  # its turn ends with its line
            self._turns.popleft()
            del self._ready[group]
            self._served.pop(group, None)
        elif served >= self._keys_per_turn:  # its turn is over: to the back
            self._turns.popleft()
            self._served.pop(group, None)
            if self._at_limit(group):
                self._parked.add(group)
            else:
                self._turns.append(group)
        else:  # its turn goes on, now or once a key of its own is done
            self._served[group] = served
            if self._at_limit(group):
                self._turns.popleft()
                self._parked.add(group)
        self._ready_count -= 1
        self._needs_processing.discard(key)
        now = self._clock()
        self._processing[key] = (now, group)
        self._metrics.on_get(key, group, now - ready_since)
        self._release_idle_getters()
        return key

    def _release_idle_getters(self) -> None:
        """After shutdown, once nothing is ready, wake every waiting getter so it stops.

        Getters that waited behind a full lane after ``shut_down`` woke them
        would otherwise wait forever once the last ready key was handed out.
        """
        if self._shutting_down and not self._ready_count:
            while self._getters:
                getter = self._getters.popleft()
                if not getter.done():
                    getter.set_result(None)

    def _wake_one_getter(self) -> None:
        while self._getters:
            getter = self._getters.popleft()
            if not getter.done():
                getter.set_result(None)
                return

    def _delay_over(self, key: K) -> None:
        del self._delayed[key]
        self.add(key)
