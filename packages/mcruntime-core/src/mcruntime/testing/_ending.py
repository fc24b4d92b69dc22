"""How a case's manager ends: with nothing of the provider's left.

A provider whose ``run()`` returns, when cancelled, without stopping its
clusters leaves their tasks running ('cluster alpha:health-probe'). That is
rule 5, disengage completely, and :func:`expect_nothing_left` reports it so,
naming the clusters; it fails for every task left, as the plain check of
:func:`~._running.running` does.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any

import mcruntime as mcr

from ._checks import DISENGAGE, expect


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
