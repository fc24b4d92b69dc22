"""What logging knows about the reconcile in progress, for wiring your own handlers.

:func:`mcruntime.configure_logging` sets all of this up; use these when a
program configures logging itself: :class:`ReconcileContextFilter` adds the
cluster, controller, namespace and name to every record, :class:`JSONFormatter`
writes one JSON object a line, and :func:`current_reconcile` says which
reconcile (if any) the running task belongs to.
"""

from __future__ import annotations

from ._manager.logging import JSONFormatter, ReconcileContextFilter
from ._reconcile.context import ReconcileContext, current_reconcile

__all__ = ["JSONFormatter", "ReconcileContext", "ReconcileContextFilter", "current_reconcile"]
