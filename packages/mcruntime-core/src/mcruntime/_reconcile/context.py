"""Which request is being reconciled right now, for code that does not take it as an argument.

Set by the controller around each reconcile, read by the context-routed client
(so "the client" talks to the request's cluster) and by logging (so every record
carries cluster, controller, namespace and name). contextvars follow asyncio
tasks, so concurrent reconciles never see each other's values.
"""

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass

from .request import Request


@dataclass(frozen=True)
class ReconcileContext:
    """The controller and request of the reconcile in progress."""

    controller: str
    request: Request


_current: ContextVar[ReconcileContext | None] = ContextVar("mcruntime_reconcile", default=None)


def current_reconcile() -> ReconcileContext | None:
    """The reconcile in progress in this task, if any."""
    return _current.get()


def current_request() -> Request | None:
    """The request being reconciled in this task, if any."""
    context = _current.get()
    return context.request if context is not None else None


def enter_reconcile(controller: str, request: Request) -> object:
    """Mark ``request`` as the reconcile in progress in this task; then call :func:`leave_reconcile`."""
    return _current.set(ReconcileContext(controller, request))


def leave_reconcile(token: object) -> None:
    """End the reconcile :func:`enter_reconcile` began (the controller calls both around each reconcile)."""
    _current.reset(token)  # type: ignore[arg-type]
