"""The one test harness: run a manager for a block, wait on a condition, connect as a testbed's admin.

Every package's tests (the core's, each provider's, the examples') and the
conformance suite use these three, so a test waits the same way everywhere
(a deadline on a condition, never a sleep that hopes), a manager is started
and stopped the same way, and a failure to start says why instead of timing
out.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import mcruntime as mcr

from ._controlplane import ControlPlane


async def wait_until(
    condition: Callable[[], object | Awaitable[object]],
    *,
    timeout: float = 30.0,
    interval: float = 0.05,
    what: str | None = None,
) -> None:
    """Poll ``condition`` (sync or async) until it is truthy; fail after ``timeout`` seconds.

    The only way tests wait: a deadline on a condition, never a sleep that
    hopes something happened meanwhile.

    An awaitable condition still running at the deadline is cancelled: a
    check that hangs (a stopped API server) fails the wait on time instead of
    outliving it (the last check, begun at the deadline, gets up to half a
    second to answer).

    Raises:
        AssertionError: the condition still failed at the deadline; the message
            says ``what`` was awaited (or names the condition) and what it last
            returned.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    answered: list[object] = []  # the last check that finished, if one did
    while True:
        result = condition()
        if inspect.isawaitable(result):
            # The last check begins at the deadline (the last sleep ends there): it still gets a
            # moment to answer. Cancelled at once, it would read as a hung check every time.
            now = loop.time()
            until = deadline if now < deadline else now + min(LAST_CHECK_GRACE, timeout)
            try:
                async with asyncio.timeout_at(until):
                    result = await result
            except TimeoutError:
                awaited = _described(condition, what)
                before = f"; the one before returned {_shown(answered[-1])}" if answered else ""
                message = f"not within {timeout:g}s: {awaited} (its last check was still running{before})"
                raise AssertionError(message) from None
        if result:
            return
        answered[:] = [result]
        if loop.time() >= deadline:
            raise AssertionError(
                f"not within {timeout:g}s: {_described(condition, what)} (it last returned {_shown(result)})"
            )
        await asyncio.sleep(min(interval, deadline - loop.time()))


MANAGER_TASK = "test:manager"
"""The name of the task :func:`running` runs ``manager.start()`` in (the conformance suite watches it)."""

LAST_CHECK_GRACE = 0.5
"""Seconds an awaitable check begun at the deadline may take before it counts as hung (at most the
timeout)."""


def _described(condition: Callable[[], object], what: str | None) -> str:
    if what:
        return what
    name = getattr(condition, "__qualname__", None)
    return name if isinstance(name, str) else repr(condition)[:200]


def _shown(result: object) -> str:
    text = repr(result)
    return text if len(text) <= 200 else f"{text[:200]}… ({len(text)} characters)"


def admin_config(plane: ControlPlane, *, trust: mcr.TrustPolicy | None = None) -> mcr.ClusterConfig:
    """The testbed control plane's admin kubeconfig as a :class:`~mcruntime.ClusterConfig`.

    ``trust`` defaults to the loader's own (the user's kubeconfig); pass
    ``TrustPolicy.untrusted()`` to load it the way a provider would.
    """
    data = plane.kubeconfig()
    origin = f"{plane.name} admin"
    if trust is None:
        return mcr.kubeconfig_from_dict(data, origin=origin)
    return mcr.kubeconfig_from_dict(data, origin=origin, trust=trust)


@asynccontextmanager
async def running(
    manager: mcr.Manager,
    *,
    start_timeout: float = 30.0,
    tasks_must_end: bool = True,
    ignore_tasks: Callable[[asyncio.Task[object]], bool] | None = None,
) -> AsyncIterator[mcr.Manager]:
    """Run ``manager`` for the block: started when the block begins, stopped when it ends.

    A manager that fails to start raises why (not a timeout); one that does
    not start within ``start_timeout`` fails the test. With ``tasks_must_end``,
    no task the block started may still run after the manager stopped (except
    those ``ignore_tasks`` accepts): the check that shutdown is complete.
    """
    before = asyncio.all_tasks()
    runner = asyncio.create_task(manager.start(), name=MANAGER_TASK)
    started = asyncio.create_task(manager.wait_started())
    try:
        async with asyncio.timeout(start_timeout):
            await asyncio.wait({runner, started}, return_when=asyncio.FIRST_COMPLETED)
        if runner.done():
            runner.result()  # the manager failed to start: raise why
            raise AssertionError("the manager returned before it started")
        yield manager
    finally:
        started.cancel()
        manager.stop()
        await runner
    if not tasks_must_end:
        return
    left = sorted(task.get_name() for task in tasks_left(before, ignore_tasks))
    assert left == [], f"tasks left running after the manager stopped: {left}"


def tasks_left(
    before: set[asyncio.Task[object]], ignore: Callable[[asyncio.Task[object]], bool] | None = None
) -> list[asyncio.Task[object]]:
    """Tasks started since ``before`` still running (the caller's own and those ``ignore`` accepts aside)."""
    current = asyncio.current_task()
    return [
        task
        for task in asyncio.all_tasks() - before
        if task is not current and not task.done() and not (ignore is not None and ignore(task))
    ]
