"""A reconcile that runs on and on is said once in the log, with the lane it holds.

A reconcile awaiting something without a timeout (a hung service of its own,
an ``Event`` nobody sets) holds its worker and one of its cluster's lanes for
as long as it waits. With one lane per cluster, that cluster's reconciles stop
there; the ``workqueue_unfinished_work_seconds`` gauge grows, and nothing else
says so. The controller's watch of its queue logs such a reconcile once at
WARNING when it passes ``after`` seconds, and once at INFO when it ends.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Hashable, Sequence

log = logging.getLogger("mcruntime.controller")

LONG_RECONCILE_AFTER = 60.0
"""Seconds after which a reconcile still running is logged (``Controller.long_reconcile_after``)."""


async def watch_long_reconciles(
    controller: str,
    processing: Callable[[], Sequence[tuple[Hashable, float, float]]],
    after: Callable[[], float],
    lanes: int,
) -> None:
    """Look at what the workers hold every tenth of ``after()``; say what has run past it, and its end.

    ``processing()`` is the queue's keys in processing, with when each was
    taken and for how long; ``after()`` is read at each look, so a test (or
    an operator) may change it on a running controller. ``0`` turns it off.
    """
    warned: dict[Hashable, float] = {}  # a key logged as long-running -> when that run was taken
    while True:
        limit = after()
        await asyncio.sleep(max(limit / 10, 0.05) if limit > 0 else 10.0)
        if limit <= 0:
            continue
        running = {key: (started, seconds) for key, started, seconds in processing()}
        for key, started in warned.copy().items():
            if running.get(key, (None,))[0] != started:  # that run ended (the key may run again since)
                del warned[key]
                log.info("controller %s: the long reconcile of %s has ended", controller, key)
        for key, (started, seconds) in running.items():
            if seconds >= limit and key not in warned:
                warned[key] = started
                cluster = getattr(key, "cluster", None)
                lane = f"one of cluster {cluster!r}'s {lanes} lane(s)" if cluster else "one worker"
                log.warning(
                    "controller %s: the reconcile of %s has run for %.0fs and is not done; it holds %s "
                    "(a call without a timeout?)",
                    controller,
                    key,
                    seconds,
                    lane,
                )
