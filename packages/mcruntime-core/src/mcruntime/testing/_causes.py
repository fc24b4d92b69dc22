"""Rule 3 over a whole case: every engagement of a name needs a change of its source as its cause.

A provider that tears its clusters down and engages them again on a timer (a
"refresh" every few polls, a re-list taken for news) passes any check made at
one moment: between two refreshes the cluster is one object, and a remove
followed by an add starts the status's engagement count at 1 again. So the
suite keeps two timelines through every block in which a provider runs: what
the case changed in the source (:class:`WatchedDriver`, which stands between
the cases and the provider's driver) and what the provider engaged
(:class:`~._harness.EngagementRecorder`). At the end of the block, each name
may have been engaged, by any moment, at most as often as its source had
given cause by then (:func:`uncaused_engagements`). And the case for an
unchanged source watches for longer than any other (:func:`watch_quietly`),
since a timer is seen only once it fires.

A cause is the name appearing in the source (``add`` of a name it does not
hold: the first, or one after a ``remove``) or its content changing (``add``,
``change``, ``change_credential`` or ``break_cluster`` with another target
than the one it holds). A ``touch``, a ``corrupt``, a second claim on the name
and a repair back to the content it held are none. Fewer engagements than
causes are fine: a poller that saw two quick changes in one pass engages once.
"""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from collections.abc import Awaitable, Iterable, Mapping
from typing import Any, TypeVar

import mcruntime as mcr

from ._driver import ProviderDriver, Target
from ._ending import ManagerWatch
from ._harness import EngagementRecorder

T = TypeVar("T")

QUIET_PASSES = 5
"""The fewest passes of the provider (``driver.settle()``) the unchanged-source case watches go by."""

QUIET_WINDOW = 2.5
"""Seconds the unchanged-source case watches a cluster whose source does not change.

A provider that "refreshes" its clusters on a timer re-engages them only when
it fires, and no case lasts long: a timer longer than this window goes unseen.
2.5 s is a dozen probe intervals of the suite, and 25 polls of a 0.1 s
poller, for the cost of one case.
"""


async def watch_quietly(driver: ProviderDriver, probe_interval: float) -> None:
    """Let :data:`QUIET_WINDOW` and :data:`QUIET_PASSES` go by: a pass of the provider, then a probe, again.

    Time passing is what is under test here, not a way to wait for
    something: each step waits for a pass (``settle``), then for one probe
    interval, so the window holds passes of a poller and probes of a watcher.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + QUIET_WINDOW
    passes = 0
    while passes < QUIET_PASSES or loop.time() < deadline:
        await driver.settle()
        passes += 1
        await asyncio.sleep(probe_interval)


class WatchedDriver(ProviderDriver):
    """The provider's driver, with a timeline of the source changes that give a cause to engage.

    Every call is handed to the wrapped driver unchanged; an edit is recorded
    before it is handed on, so no engagement it causes can come first. While
    the provider runs, every call also watches it (:attr:`watch`): a
    ``settle()`` waiting for a poll of a provider whose ``run()`` raised
    fails at once, saying so, instead of when the driver's own timeout ends.
    """

    def __init__(self, driver: ProviderDriver) -> None:
        self.wrapped = driver
        self.watch: ManagerWatch | None = None
        """The running manager's watch, set by the case for each block in which the provider runs."""
        self.held: dict[str, Target] = {}
        """What the source holds for each name, as the case wrote it (a corrupt entry keeps its last)."""
        self.causes: defaultdict[str, list[float]] = defaultdict(list)
        """Per source name, the monotonic times of the edits that give a cause to engage it."""

    def __getattr__(self, name: str) -> Any:
        if name == "wrapped":  # not set yet: no driver to hand the question to
            raise AttributeError(name)
        return getattr(self.wrapped, name)

    def __repr__(self) -> str:
        return repr(self.wrapped)

    async def _call(self, awaitable: Awaitable[T], what: str) -> T:
        """Await a call of the wrapped driver, stopped at once if the provider fails meanwhile."""
        if self.watch is None:
            return await awaitable
        return await self.watch.guard(awaitable, f"the driver's {what}")

    def _write(self, name: str, target: Target) -> None:
        if self.held.get(name) != target:
            self.causes[name].append(time.monotonic())
        self.held[name] = target

    def build(self) -> mcr.Provider:
        return self.wrapped.build()

    def engaged_name(self, name: str) -> str:
        return self.wrapped.engaged_name(name)

    def status(self, name: str) -> mcr.ClusterStatus | None:
        return self.wrapped.status(name)

    def use_namespace(self, namespace: str) -> None:
        self.wrapped.use_namespace(namespace)

    async def add(self, name: str, target: Target) -> None:
        self._write(name, target)
        await self._call(self.wrapped.add(name, target), f"add({name!r})")

    async def change(self, name: str, target: Target) -> None:
        self._write(name, target)
        await self._call(self.wrapped.change(name, target), f"change({name!r})")

    async def change_credential(self, name: str, target: Target) -> None:
        self._write(name, target)
        await self._call(self.wrapped.change_credential(name, target), f"change_credential({name!r})")

    async def break_cluster(self, name: str, target: Target) -> None:
        self._write(name, target)
        await self._call(self.wrapped.break_cluster(name, target), f"break_cluster({name!r})")

    async def touch(self, name: str, target: Target) -> None:
        await self._call(self.wrapped.touch(name, target), f"touch({name!r})")

    async def corrupt(self, name: str) -> None:
        await self._call(self.wrapped.corrupt(name), f"corrupt({name!r})")

    async def remove(self, name: str) -> None:
        self.held.pop(name, None)
        await self._call(self.wrapped.remove(name), f"remove({name!r})")

    async def add_duplicate(self, name: str, target: Target) -> None:
        await self._call(self.wrapped.add_duplicate(name, target), f"add_duplicate({name!r})")

    def duplicate_reported(self, name: str) -> bool:
        return self.wrapped.duplicate_reported(name)

    async def settle(self) -> None:
        await self._call(self.wrapped.settle(), "settle()")


def unwrapped(driver: ProviderDriver) -> ProviderDriver:
    """The provider's own driver (its capabilities, its class name), watched or not."""
    return driver.wrapped if isinstance(driver, WatchedDriver) else driver


def uncaused_engagements(
    driver: WatchedDriver, recorder: EngagementRecorder, since: float, held: Iterable[str]
) -> list[str]:
    """Each name engaged more often than its source gave cause, since ``since``: what was seen.

    ``held`` are the source names the source held at ``since``: the provider
    started then, so each of them had one cause to be engaged already.
    """
    held = set(held)
    problems = []
    for source_name in sorted(held | set(driver.causes)):
        name = driver.engaged_name(source_name)
        engaged = [(at, cluster) for at, cluster in recorder.timeline(name) if at >= since]
        causes = [at for at in driver.causes.get(source_name, []) if at >= since]
        allowed = int(source_name in held)
        for count, (at, _cluster) in enumerate(engaged, 1):
            given = allowed + sum(1 for cause in causes if cause <= at)
            if count > given:
                problems.append(_uncaused(name, since, count, engaged, causes, recorder.stopped_at))
                break
    return problems


def _uncaused(
    name: str,
    since: float,
    count: int,
    engaged: list[tuple[float, mcr.Cluster]],
    causes: list[float],
    stopped_at: Mapping[int, float],
) -> str:
    def offset(at: float) -> str:
        return f"+{at - since:.2f}s"

    moments = []
    for at, cluster in engaged[:_SHOWN]:
        stopped = stopped_at.get(id(cluster))
        moments.append(offset(at) + (f" (stopped {offset(stopped)})" if stopped is not None else ""))
    if len(engaged) > _SHOWN:
        moments.append(f"and {len(engaged) - _SHOWN} more")
    changed = ", ".join(offset(cause) for cause in causes) or "never"
    return (
        f"{name!r} was engaged {len(engaged)} times while the provider ran, and engagement {count} "
        f"at {offset(engaged[count - 1][0])} had no change of its source to cause it "
        f"(engaged at {', '.join(moments)}; its source changed since the provider started: {changed}); "
        "a touch, a relist or a poll of the same content is no reason to engage again"
    )


_SHOWN = 6
"""Engagements a failure lists; a provider re-engaging every poll for 30 s would list hundreds."""
