"""What a reconciler receives and returns.

A ``Request`` names one object in one cluster; it carries no object, because a
level-triggered reconciler reads the current state itself. Reconcilers are
``async def reconcile(request) -> Result | None`` functions or objects with such
a ``reconcile`` method, so a single-cluster reconciler is already a fleet
reconciler: the request says which cluster.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from .._base.errors import MCRuntimeError

LOCAL_CLUSTER = ""
"""The name of the manager's own (hub) cluster, as in multicluster-runtime."""


@dataclass(frozen=True, slots=True, order=True)
class Request:
    """One object to reconcile: its cluster, namespace (empty when cluster-scoped) and name."""

    cluster: str
    namespace: str
    name: str

    def __str__(self) -> str:
        cluster = self.cluster or "(local)"
        key = f"{self.namespace}/{self.name}" if self.namespace else self.name
        return f"{cluster}:{key}"


@dataclass(frozen=True, slots=True)
class Result:
    """What to do after a successful reconcile.

    ``requeue_after`` reconciles again after that many seconds (periodic checks,
    waiting on something outside Kubernetes); ``requeue`` again with the rate
    limiter's backoff. ``None`` or ``Result()`` means done until the next event.
    """

    requeue: bool = False
    requeue_after: float | None = None


class TerminalError(MCRuntimeError):
    """Raise from a reconciler for a failure retrying cannot fix; it is logged, not retried."""


ReconcileFunction = Callable[[Request], Awaitable[Result | None]]
"""A reconciler written as a coroutine function, for controllers that need no state of their own."""


@runtime_checkable
class Reconciler(Protocol):
    """An object whose ``reconcile`` method takes a :class:`Request`."""

    async def reconcile(self, request: Request) -> Result | None:
        """Bring the named object's world to its desired state."""
        ...


def as_reconcile_function(reconciler: ReconcileFunction | Reconciler) -> ReconcileFunction:
    """Accept either form of reconciler and return the coroutine function to call."""
    method = getattr(reconciler, "reconcile", None)
    if method is not None and inspect.iscoroutinefunction(method):
        return method  # type: ignore[no-any-return]
    if inspect.iscoroutinefunction(reconciler):
        return reconciler
    if callable(reconciler):
        return reconciler  # an async callable object, or a functools.partial of one
    raise TypeError(
        f"{reconciler!r} is not a reconciler: pass an async function of a Request, "
        "or an object with an async reconcile(request) method"
    )
