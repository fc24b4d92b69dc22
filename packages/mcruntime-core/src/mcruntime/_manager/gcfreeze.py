"""Moving synced caches out of the cyclic garbage collector's way.

A cache holds every object of every watched kind: hundreds of thousands of
dicts that live as long as the cluster does. CPython's cyclic collector walks
all of them on every full collection, and full collections come more often the
more the program allocates, so a reconcile's latency grows with the size of the
cache rather than with its own work (benchmark S10: p99 0.74x with freezing).
``gc.freeze()`` moves everything alive into a permanent generation the collector
skips. Cached objects are plain JSON dicts and lists without cycles, so reference
counting still frees one the moment an update or delete replaces it: freezing
costs no memory for them.

Freezing is coalesced: a burst of clusters syncing (a fleet engaging) leads to
one collection and one freeze shortly after the burst, not one per cluster.
Garbage cycles alive at that moment are collected first, so none is frozen.
That collection walks everything allocated since the last freeze, which during
the cold start of a large fleet is a lot (16 % of the event loop's time at
3,000 clusters when every one-second gap between syncs froze): freezes are
also paced by their own cost, at most ``1 / (1 + pace)`` of the time.

A burst that never pauses is still frozen every :data:`FREEZE_LONGEST`
seconds. The cold start of 10,000 clusters syncs without a one-second gap
for about 100 s, and, never frozen, its heap was walked by CPython's own full
collections as it grew: 19 of them, 13 s of the engage's CPU (benchmark S12).

A frozen object is out of the collector's reach for good: when a cluster
that was frozen stops, the reference cycles among its objects (tasks,
informers, handlers) are never collected. So once clusters stopped, the
heap is thawed, collected and frozen again as soon as the pace allows,
once a hundredth of the engaged clusters (at least one) stopped: at 10,000
clusters, one walk of the whole heap per 100 stopped clusters, not one per
cluster, and never more than the pace allows.

The heap is also frozen once when the manager starts, before any cluster
engages: what is alive then is the program itself (modules, classes,
functions, its configuration), which lives as long as the process. Left in
the generations, it is walked again by every full collection while the first
caches fill, which was two of every three full collections of a cold start
over 10 clusters and about a tenth of its CPU (benchmark S1).
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time

log = logging.getLogger("mcruntime.manager")

FREEZE_DELAY = 1.0
"""Seconds after the last cache sync of a burst before the heap is frozen."""

FREEZE_LONGEST = 10.0
"""Seconds a burst of syncs that never pauses may put the freeze off."""

FREEZE_PACE = 19.0
"""After a freeze that took ``t`` seconds, the next waits at least ``FREEZE_PACE * t`` (5 % of the time)."""


class CacheFreezer:
    """Freezes the heap once after each burst of cache syncs; a no-op when disabled."""

    def __init__(
        self,
        enabled: bool,
        delay: float = FREEZE_DELAY,
        pace: float = FREEZE_PACE,
        longest: float = FREEZE_LONGEST,
    ) -> None:
        self.enabled = enabled
        self._delay = delay
        self._pace = pace
        self._longest = longest
        self._burst_began = 0.0  # loop time of the first sync the pending freeze waits for
        self._stopped = 0  # clusters stopped since the last thaw: their frozen cycles wait for one
        self._thaw = False
        self.thaws: int = 0
        self._not_before = float("-inf")  # loop time before which the last freeze's cost forbids another
        self._pending: asyncio.TimerHandle | None = None
        self.freezes: int = 0

    def started(self) -> None:
        """The manager starts: freeze the program's own long-lived objects before caches fill."""
        if self.enabled:
            self._freeze()

    def synced(self) -> None:
        """A cluster's caches finished their initial list: freeze after the burst settles."""
        if not self.enabled:
            return
        loop = asyncio.get_running_loop()
        now = loop.time()
        if self._pending is None:
            self._burst_began = now
        else:
            self._pending.cancel()
        settle = min(now + self._delay, self._burst_began + self._longest)
        self._pending = loop.call_at(max(settle, self._not_before), self._freeze)

    def stopped(self, engaged: int) -> None:
        """A cluster stopped, ``engaged`` remain: thaw at the next freeze once enough have stopped."""
        if not self.enabled:
            return
        self._stopped += 1
        if self._stopped >= max(1, engaged // 100):
            self._thaw = True
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                return  # stopped outside the loop (the process ending): the next freeze thaws
            at = max(loop.time(), self._not_before)  # at once, as far as the pace allows
            if self._pending is None or self._pending.when() > at:
                if self._pending is not None:
                    self._pending.cancel()
                self._pending = loop.call_at(at, self._freeze)

    def _freeze(self) -> None:
        self._pending = None
        began = time.perf_counter()
        if self._thaw:
            gc.unfreeze()  # the stopped clusters' cycles are collectable again
            self._thaw, self._stopped = False, 0
            self.thaws += 1
        gc.collect()
        gc.freeze()
        self._not_before = asyncio.get_running_loop().time() + self._pace * (time.perf_counter() - began)
        self.freezes += 1
        # Not gc.get_freeze_count(): it walks every frozen object, millions in a large fleet.
        log.debug("heap frozen after cache sync (%d so far)", self.freezes)

    def cancel(self) -> None:
        if self._pending is not None:
            self._pending.cancel()
            self._pending = None
