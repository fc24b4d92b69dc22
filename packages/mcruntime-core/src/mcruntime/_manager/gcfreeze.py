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

During a burst, each of CPython's own full collections is followed at once
by a freeze: everything alive then has just been walked and found reachable,
so the freeze costs no collection of its own, and the next full collection
walks only what was allocated since instead of all the burst has cached so
far. Without it a cold start's full collections grow with the heap, so their
total grows with the square of the fleet: 5.2 s of a 6,000-cluster engage's
16.6 CPU s on one plane, against 0.1 s of 1.8 at 1,000.

A frozen object is out of the collector's reach for good: when a cluster
that was frozen stops, the reference cycles among its objects (tasks,
informers, handlers) are never collected. So once a tenth of the engaged
clusters (at least one) stopped, the heap is thawed, collected and frozen
again, as soon as the pace allows. That collection walks the whole heap on
the event loop, which at 10,000 clusters took 2.2 s (benchmark S12): once
per 1,000 stopped clusters there, never more often than the pace allows.
What waits for it is bounded by the fleet: the cycles of at most a tenth of
it, about the memory a tenth of the engaged clusters hold. CPython's own
full collections wait, likewise, for a quarter more long-lived objects.

The heap is also frozen once when the manager starts, before any cluster
engages: what is alive then is the program itself (modules, classes,
functions, its configuration), which lives as long as the process. Left in
the generations, it is walked again by every full collection while the first
caches fill, which was two of every three full collections of a cold start
over 10 clusters and about a tenth of its CPU (benchmark S1). The burst that
follows lasts until the first engage settles (at most ``longest`` seconds),
not the settling delay: a provider's first pass over 10,000 kubeconfig files
took seconds before any cluster engaged, and, no longer followed by freezes,
CPython's full collections walked all it had read so far, each more than the
last: twelve in under three seconds, 1.1 s of CPU (benchmark S12).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import time

log = logging.getLogger("mcruntime.manager")

FREEZE_DELAY = 1.0
"""Seconds after the last cache sync of a burst before the heap is frozen."""

FREEZE_LONGEST = 10.0
"""Seconds a burst of syncs that never pauses may put the freeze off."""

THAW_SHARE = 10
"""Thaw once ``1 / THAW_SHARE`` of the engaged clusters (at least one) stopped."""

THAW_NOTICE = 1.0
"""Seconds of a thaw's collection past which it is logged at INFO: a pause anyone would see."""

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
        self._closed = False  # cancel() until started(): a manager shutting down schedules nothing
        self._riding = False  # our callback is in gc.callbacks: a burst is on
        self.rides: int = 0
        """Freezes that followed one of CPython's own full collections during a burst."""
        self.freezes: int = 0
        self.longest_thaw: float = 0.0
        """Seconds of the longest thaw so far: one collection of the whole heap, on the event loop."""

    def started(self) -> None:
        """The manager starts: freeze the program's own long-lived objects before caches fill.

        Then a burst begins: the providers discover and build their first
        clusters now. It lasts until the first engage settles, or
        ``longest`` seconds: a provider's first pass over a large fleet (10,000
        kubeconfig files read and parsed) can take seconds before the first
        cluster engages, and its full collections must not each walk all it
        has read so far.
        """
        self._closed = False
        if self.enabled:
            self._freeze()
            self._burst(self._longest)

    def engaging(self) -> None:
        """A cluster engages: its caches will fill, so a burst begins (or goes on) now.

        Its full collections are followed by a freeze from the first engage
        on, not from the first sync: a fleet engaging at once allocates for
        seconds before any cluster has synced.
        """
        self.synced()

    def synced(self) -> None:
        """A cluster's caches finished their initial list: freeze after the burst settles."""
        self._burst(self._delay)

    def _burst(self, settle_after: float) -> None:
        """A burst begins or goes on: freeze once ``settle_after`` seconds pass without another."""
        if not self.enabled or self._closed:
            return
        loop = asyncio.get_running_loop()
        now = loop.time()
        if self._pending is None:
            self._burst_began = now
            self._ride(True)
        else:
            self._pending.cancel()
        settle = min(now + settle_after, self._burst_began + self._longest)
        self._pending = loop.call_at(max(settle, self._not_before), self._freeze)

    def stopped(self, engaged: int) -> None:
        """A cluster stopped, ``engaged`` remain: once enough have stopped, thaw as soon as the pace allows.

        "Enough" is a tenth of the engaged clusters (:data:`THAW_SHARE`, at
        least one), so a thaw's walk of the whole heap is shared by that many stops.
        """
        if not self.enabled or self._closed:
            return
        self._stopped += 1
        if self._stopped >= max(1, engaged // THAW_SHARE):
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

    def _ride(self, on: bool) -> None:
        """Follow CPython's own full collections with a freeze (``on``), or stop."""
        if on and not self._riding:
            gc.callbacks.append(self._after_collection)
        elif not on and self._riding:
            with contextlib.suppress(ValueError):  # the program may have cleared gc.callbacks
                gc.callbacks.remove(self._after_collection)
        self._riding = on

    def _after_collection(self, phase: str, info: dict[str, int]) -> None:
        # The collector's "stop": survivors of a full collection were all just found reachable.
        if phase == "stop" and info["generation"] == 2:
            gc.freeze()
            self.rides += 1

    def _freeze(self) -> None:
        self._pending = None
        self._ride(False)
        began = time.perf_counter()
        thawed, stopped = self._thaw, self._stopped
        if thawed:
            gc.unfreeze()  # the stopped clusters' cycles are collectable again
            self._thaw, self._stopped = False, 0
            self.thaws += 1
        gc.collect()
        gc.freeze()
        took = time.perf_counter() - began
        self._not_before = asyncio.get_running_loop().time() + self._pace * took
        self.freezes += 1
        # Not gc.get_freeze_count(): it walks every frozen object, millions in a large fleet.
        if not thawed:
            log.debug("heap frozen in %.3fs (%d so far)", took, self.freezes)
            return
        self.longest_thaw = max(self.longest_thaw, took)
        log.log(
            logging.INFO if took >= THAW_NOTICE else logging.DEBUG,
            "heap thawed, collected and frozen again in %.2fs, the event loop paused meanwhile: "
            "%d clusters stopped since the last thaw left their reference cycles frozen (gc_freeze)",
            took,
            stopped,
        )

    def cancel(self) -> None:
        """The manager is shutting down: drop the pending freeze and schedule none until :meth:`started`."""
        self._closed = True
        self._ride(False)
        if self._pending is not None:
            self._pending.cancel()
            self._pending = None
