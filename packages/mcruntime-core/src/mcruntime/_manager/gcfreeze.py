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
The full collection holds the GIL for as long as it walks the heap, which in a
process of 10,000 clusters is long enough to be felt (the sharding test at
10,000 clusters found a joining replica spending a quarter of its time here
while it engaged the fleet in bursts about a second apart). So a freeze waits
at least ``COST_FACTOR`` times as long as the last one took: freezing stays
a small share of the process's time however large the heap grows.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time

log = logging.getLogger("mcruntime.manager")

FREEZE_DELAY = 1.0
"""Seconds after the last cache sync of a burst before the heap is frozen."""
COST_FACTOR = 20.0
"""A freeze waits at least this many times as long as the last one took."""


class CacheFreezer:
    """Freezes the heap once after each burst of cache syncs; a no-op when disabled."""

    def __init__(self, enabled: bool, delay: float = FREEZE_DELAY) -> None:
        self.enabled = enabled
        self._delay = delay
        self._pending: asyncio.TimerHandle | None = None
        self.freezes: int = 0
        self.last_cost: float = 0.0
        """Seconds the last collection and freeze took."""

    def synced(self) -> None:
        """A cluster's caches finished their initial list: freeze after the burst settles."""
        if not self.enabled:
            return
        if self._pending is not None:
            self._pending.cancel()
        delay = max(self._delay, self.last_cost * COST_FACTOR)
        self._pending = asyncio.get_running_loop().call_later(delay, self._freeze)

    def _freeze(self) -> None:
        self._pending = None
        began = time.perf_counter()
        gc.collect()
        gc.freeze()
        self.last_cost = time.perf_counter() - began
        self.freezes += 1
        if log.isEnabledFor(logging.DEBUG):  # counting walks every frozen object: only when asked
            log.debug(
                "heap frozen after cache sync in %.3fs: %d objects outside the collector",
                self.last_cost,
                gc.get_freeze_count(),
            )

    def cancel(self) -> None:
        if self._pending is not None:
            self._pending.cancel()
            self._pending = None
