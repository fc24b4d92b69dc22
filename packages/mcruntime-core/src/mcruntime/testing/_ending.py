"""How a case's manager ends: at once when its provider fails, and with nothing of the provider's left.

A provider whose ``run()`` raises makes the manager log it and shut down, and
nothing a case waits for happens after that: no cluster is engaged, no poll
ends (``driver.settle()``), no status changes. Each wait ran out after its
30 s and was reported as the rule it waited for (rule 3, say), or as the
driver's own timeout, with the provider's exception far below as "during
handling of the above exception". So a case's waits race the manager's and
the provider's tasks (:meth:`ManagerWatch.guard`): the moment either ends
with an error, the wait stops and the case fails with :class:`ProviderFailed`,
which leads with the provider's exception and chains it.

A provider whose ``run()`` returns while the manager runs, without an error
and before it was cancelled, breaks the contract in the same silent way: the
manager warns and goes on, but nothing is engaged or disengaged any more. It
fails the case at once too, as a :class:`ProviderFailed` that says it returned.

A provider whose ``run()`` returns, when cancelled, without stopping its
clusters leaves their tasks running ('cluster alpha:health-probe'). That is
rule 5, disengage completely, and :func:`expect_nothing_left` reports it so,
naming the clusters; it fails for every task left, as the plain check of
:func:`~._running.running` does.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, TypeVar

import mcruntime as mcr

from ._checks import DISENGAGE, expect
from ._running import MANAGER_TASK

T = TypeVar("T")

PROVIDER_TASK = "provider"
"""The name :meth:`mcruntime.Manager.start` gives the task that runs its provider's ``run()``."""


class ProviderFailed(AssertionError):
    """A case stopped because its provider's ``run()`` (or its manager) raised; that error is chained.

    Also raised, with nothing chained, when the provider's ``run()`` returned
    before the manager stopped it.
    """


class _Returned(Exception):
    """Stands for the error a provider's ``run()`` that returned early did not raise."""


class ManagerWatch:
    """The manager's task and its provider's, watched from the moment the manager started.

    ``redact`` hides the case's credentials in the provider's exception
    message (rule 7 holds for failure messages too).
    """

    def __init__(self, redact: Callable[[str], str] | None = None) -> None:
        self._redact = redact or (lambda text: text)
        self._provider: object | None = None
        self._tasks: list[asyncio.Task[Any]] = []
        self._failure: tuple[BaseException, str] | None = None  # the error, and who raised it
        self._context: BaseException | None = None  # the error's own context, before shutdown set another
        self._ending = False  # the case's block is over: the manager stops, and run() may return

    def attach(self, manager: mcr.Manager, before: Iterable[asyncio.Task[Any]]) -> None:
        """Watch the manager's and the provider's tasks: those started since ``before`` by those names.

        A provider that raised at once may have ended already; the manager's
        task then ends with its error, and the traceback says whose it was.
        """
        self._provider = manager.provider
        new = asyncio.all_tasks() - set(before)
        self._tasks = [task for task in new if task.get_name() in (PROVIDER_TASK, MANAGER_TASK)]
        for task in self._tasks:
            task.add_done_callback(self._ended)

    def ending(self) -> None:
        """The case's block is over: from now on the provider's ``run()`` may end without failing it."""
        self._ending = True

    def _ended(self, task: asyncio.Task[Any]) -> None:
        if self._failure is not None or task.cancelled():
            return
        if task.exception() is None:
            # Not asked to stop (a run() that swallows its cancellation returns too): it returned early.
            if task.get_name() == PROVIDER_TASK and not self._ending and task.cancelling() == 0:
                self._failure = (_Returned(), "the provider's run()")
            return
        error = task.exception()
        assert error is not None
        ran_it = task.get_name() == PROVIDER_TASK or self._raised_in_provider(error)
        self._failure = (error, "the provider's run()" if ran_it else "the manager")
        self._context = error.__context__

    def _raised_in_provider(self, error: BaseException) -> bool:
        """Whether ``error`` came through a method of the provider (its ``run()``, what it calls)."""
        trace = error.__traceback__
        while trace is not None:
            if self._provider is not None and trace.tb_frame.f_locals.get("self") is self._provider:
                return True
            trace = trace.tb_next
        return False

    @property
    def failure(self) -> BaseException | None:
        """The error the provider's ``run()`` or the manager ended with, once one did.

        ``None`` too when ``run()`` returned early: there is no error to chain
        (:attr:`ended` says whether anything ended the case).
        """
        if self._failure is None or isinstance(self._failure[0], _Returned):
            return None
        return self._failure[0]

    @property
    def ended(self) -> bool:
        """Whether the provider's ``run()`` or the manager failed, or ``run()`` returned early."""
        return self._failure is not None

    def failed(self, detail: str) -> ProviderFailed:
        """The case's failure: who raised what, ``detail`` after it; raise it ``from self.failure``."""
        assert self._failure is not None
        error, who = self._failure
        if isinstance(error, _Returned):
            return ProviderFailed(
                f"{who} returned while the manager ran, before it was cancelled: it engages and "
                f"disengages nothing from then on, and a provider's run() is to run until cancelled "
                f"({detail})"
            )
        said = self._redact(str(error))
        raised = f"{type(error).__name__}: {said}" if said else type(error).__name__
        return ProviderFailed(f"{who} raised {raised} ({detail})")

    async def guard(self, awaitable: Awaitable[T], what: str) -> T:
        """Await ``awaitable``, unless the provider or the manager fails first: then fail at once.

        Run as a task of its own, raced against the watched tasks, so a wait
        that can no longer end (a poll of a dead provider) is cancelled.
        """
        work = asyncio.ensure_future(awaitable)
        watched = {task for task in self._tasks if not task.done()}
        try:
            while True:
                self._raise_if_failed(what)
                if not watched:
                    return await work
                done, _pending = await asyncio.wait({work, *watched}, return_when=asyncio.FIRST_COMPLETED)
                if work in done:
                    if not work.cancelled() and work.exception() is not None:  # for the provider's failure?
                        self._raise_if_failed(what)
                    return work.result()
                watched -= done
        finally:
            if not work.done():
                work.cancel()
                await asyncio.wait({work})

    def _raise_if_failed(self, what: str) -> None:
        if self.ended:
            stopped = f"the case stopped waiting at once; it was waiting for {what}"
            raise self.failed(stopped) from self.failure

    def case_failed(self, error: BaseException) -> ProviderFailed | None:
        """The case's failure when its block ended in ``error`` after the provider failed; else ``None``.

        The manager's task raises the provider's error again when the block
        stops it, over whatever the case raised: so the case's own error is
        that error's context, and the context the error had is put back.
        """
        if not self.ended:
            return None
        crash = self.failure  # None when run() returned: the manager then stopped with no error of its own
        seen: BaseException | None = error
        if crash is not None:
            if error is crash:
                seen = crash.__context__ if crash.__context__ is not self._context else None
            crash.__context__ = self._context
        if isinstance(seen, ProviderFailed):
            return ProviderFailed(*seen.args)
        if seen is None:
            return self.failed("while the case ran")
        said = self._redact(str(seen)).splitlines()
        return self.failed(f"the case failed after it: {type(seen).__name__}: {said[0] if said else ''}")


def expect_nothing_left(tasks: Iterable[asyncio.Task[Any]], clusters: list[tuple[str, mcr.Cluster]]) -> None:
    """Rule 5 after the manager stopped: no task ``tasks`` holds still runs, every cluster is stopped.

    ``tasks`` are those started while the manager ran that are still
    running; a cluster's tasks are named after it (``cluster <name>:<what>``),
    so the failure names the clusters the provider did not stop.
    """
    owners = {cluster.tasks.owner: name for name, cluster in clusters}
    stopped_not: dict[str, list[str]] = {}
    others: list[str] = []
    for task in sorted(tasks, key=asyncio.Task.get_name):
        name = task.get_name()
        owner = _owner(name, owners)
        if owner is not None:
            stopped_not.setdefault(owner, []).append(name)
        else:
            coroutine = getattr(task.get_coro(), "__qualname__", None)
            others.append(f"{name!r} ({coroutine})" if coroutine and name.startswith("Task-") else repr(name))
    also = f"; also left running: {', '.join(others)}" if others else ""
    which = ", ".join(repr(owner) for owner in stopped_not)
    left = ", ".join(repr(name) for names in stopped_not.values() for name in names)
    expect(
        not stopped_not,
        DISENGAGE,
        f"the provider's run() returned without stopping cluster{'s' if len(stopped_not) > 1 else ''} "
        f"{which}: its tasks {left} still ran after the manager stopped{also}; when run() is cancelled, "
        "every cluster must be stopped (ClusterSet.run stops them when it is cancelled: cancel and "
        "await its task)",
    )
    expect(
        not others,
        DISENGAGE,
        f"tasks left running after the manager stopped: {', '.join(others)}; the provider's run() "
        "returned without ending them (cancel and await every task it starts)",
    )
    for name, cluster in clusters:
        expect(
            cluster.stopped,
            DISENGAGE,
            f"cluster {name!r} ({cluster!r}) was not stopped with its provider: its run() returned without "
            "stopping it",
        )
        expect(len(cluster.tasks) == 0, DISENGAGE, f"cluster {name!r} still owns {len(cluster.tasks)} tasks")
        expect(cluster.transport.closed, DISENGAGE, f"cluster {name!r} left its connections open")


def _owner(task_name: str, owners: dict[str, str]) -> str | None:
    """The cluster a task belongs to, by its name: a known cluster's, or any ``cluster <name>:``."""
    for owner, name in owners.items():
        if task_name.startswith(f"{owner}:"):
            return name
    prefix, _sep, rest = task_name.partition(" ")
    if prefix == "cluster" and ":" in rest:
        return rest.partition(":")[0]
    return None
