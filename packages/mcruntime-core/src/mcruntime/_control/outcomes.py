"""What a reconcile's outcome does to its request: forget it, requeue it, or park it.

A reconcile that returned is counted and its request forgotten, requeued with
backoff or requeued after a delay, as its :class:`Result` says. A reconcile
that raised is counted by what it raised, with one log line that says what
happens next. One that failed because its cluster does not answer is parked:
held until that cluster's health probe gets an answer, instead of burning its
backoff on retries that would fail at once.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .._base.errors import ClusterNotFound, Conflict, Fenced, Forbidden, Unreachable
from .._client.permissions import refused_by_authorization
from .._reconcile.request import Request, Result, TerminalError
from .workqueue import WorkQueue

if TYPE_CHECKING:
    from .._fleet.cluster import Cluster

log = logging.getLogger("mcruntime.controller")


@dataclass
class ReconcileStats:
    """Counts per outcome, for tests and metrics."""

    success: int = 0
    requeue: int = 0
    requeue_after: int = 0
    error: int = 0
    terminal: int = 0
    dropped_cluster_gone: int = 0
    fenced: int = 0


def apply_result(
    controller: str, queue: WorkQueue[Request], stats: ReconcileStats, request: Request, result: object
) -> str:
    """Count a returned reconcile and queue its request as ``result`` asks; the outcome's name."""
    if result is not None and not isinstance(result, Result):
        # A reconciler bug, but a worker must not die of it: treat it as a failed reconcile.
        stats.error += 1
        queue.add_rate_limited(request)
        log.error(
            "controller %s: reconcile of %s returned a %s; expected Result or None; "
            "counted as an error and retried (retry %d)",
            controller,
            request,
            type(result).__name__,
            queue.num_requeues(request),
        )
        return "error"
    if result is not None and result.requeue_after:
        stats.requeue_after += 1
        queue.forget(request)
        queue.add_after(request, result.requeue_after)
        return "requeue_after"
    if result is not None and result.requeue:
        stats.requeue += 1
        queue.add_rate_limited(request)
        return "requeue"
    stats.success += 1
    queue.forget(request)
    return "success"


def apply_failure(
    controller: str,
    queue: WorkQueue[Request],
    stats: ReconcileStats,
    request: Request,
    error: Exception,
    park: Callable[[Request, Unreachable], bool],
    *,
    left: bool = False,
) -> str:
    """Count a reconcile that raised ``error``, queue its request as the error asks; the outcome's name.

    Only a reconciler's own bug gets a traceback: the errors the runtime
    expects (a cluster gone, a fence, a conflict, a missing permission, a
    cluster not answering) get one line naming the request and what comes next.
    ``left``: the request's cluster left (or was replaced) while the reconcile
    ran, so a client error that followed is its stopping, and nothing is retried
    here (a replacement's informer hands the object to the new engagement).
    """
    if isinstance(error, ClusterNotFound) or (left and isinstance(error, Unreachable)):
        stats.dropped_cluster_gone += 1
        queue.forget(request)
        why = "is gone" if not left else f"left while it was reconciled ({error})"
        log.info("controller %s: %s dropped: cluster %r %s", controller, request, request.cluster, why)
        return "dropped"
    if isinstance(error, Fenced):
        # The replica's share or leadership lapsed mid-reconcile, and the write was not sent.
        # Queued again, the request waits until this replica holds its cluster again; a
        # sharded gate drops it if the cluster moved away (its new owner reconciles it).
        stats.fenced += 1
        queue.add_rate_limited(request)
        log.warning("controller %s: %s stopped, its write not sent: %s", controller, request, error)
        return "error"
    if isinstance(error, (Conflict, Forbidden)):
        # Optimistic concurrency doing its job (usually a cache behind our own write), or a
        # permission missing (the cluster's record names it, once): a retry and a line, no traceback.
        stats.error += 1
        queue.add_rate_limited(request)
        if isinstance(error, Conflict):
            what, level = "a conflict", logging.INFO
        elif refused_by_authorization({"message": error.message}):
            # DEBUG for RBAC's 403: the cluster's permission record warns once and /readyz
            # names it, so a line per object per retry would only bury it.
            what, level = "a missing permission", logging.DEBUG
        else:
            # An admission plugin's or a webhook's 403 (or a namespace being deleted): nothing
            # else records it, so this line is the only place it shows.
            what, level = "a refusal (not RBAC's: admission, a webhook or a policy)", logging.WARNING
        log.log(level, "controller %s: %s hit %s, retrying: %s", controller, request, what, error)
        return "error"
    if isinstance(error, Unreachable):
        stats.error += 1
        if park(request, error):
            log.info(
                "controller %s: %s waits until cluster %r answers again: %s",
                controller,
                request,
                error.cluster,
                error,
            )
        else:
            queue.add_rate_limited(request)
            log.warning(
                "controller %s: reconcile of %s failed (retry %d): %s",
                controller,
                request,
                queue.num_requeues(request),
                error,
            )
        return "error"
    if isinstance(error, TerminalError):
        stats.terminal += 1
        queue.forget(request)
        log.error("controller %s: %s failed terminally; not retrying", controller, request, exc_info=error)
        return "terminal"
    stats.error += 1
    queue.add_rate_limited(request)
    log.error(
        "controller %s: reconcile of %s failed (retry %d)",
        controller,
        request,
        queue.num_requeues(request),
        exc_info=error,
    )
    return "error"


class ParkedRequests:
    """Requests held until the cluster that did not answer answers again, by that cluster's name.

    Each parked cluster has one waiter, a task of that cluster's own (it ends
    with the cluster): when the cluster's circuit closes, its requests go back
    through ``requeue``. ``drop`` forgets a cluster that left, and its requests
    wherever they are parked.
    """

    def __init__(self, controller: str, requeue: Callable[[Request], None]) -> None:
        self._controller = controller
        self._requeue = requeue
        self._parked: dict[str, set[Request]] = {}

    def park(self, name: str, cluster: Cluster, request: Request) -> bool:
        """Hold ``request`` until ``cluster`` (engaged as ``name``) answers; False if not unreachable."""
        recovered = cluster.transport.health.recovery()
        if recovered is None:
            return False
        parked = self._parked.get(name)
        if parked is None:
            parked = self._parked[name] = set()
            cluster.tasks.spawn(self._unpark(name, recovered), f"parked:{self._controller}")
        parked.add(request)
        return True

    async def _unpark(self, name: str, recovered: asyncio.Event) -> None:
        await recovered.wait()
        for request in self._parked.pop(name, set()):
            self._requeue(request)

    def drop(self, name: str) -> None:
        self._parked.pop(name, None)
        for cluster, parked in list(self._parked.items()):
            parked.difference_update({request for request in parked if request.cluster == name})
            if not parked:
                del self._parked[cluster]


def log_cut_short(controller: str, requests: list[Request], grace: float) -> None:
    """Name the reconciles a drain that ran out is about to cancel (the first ten of them)."""
    shown = ", ".join(str(request) for request in requests[:10])
    more = f" and {len(requests) - 10} more" if len(requests) > 10 else ""
    plural = "" if len(requests) == 1 else "s"
    log.warning(
        "controller %s: cancelling %d reconcile%s still running after %.0fs: %s%s",
        controller,
        len(requests),
        plural,
        grace,
        shown,
        more,
    )
