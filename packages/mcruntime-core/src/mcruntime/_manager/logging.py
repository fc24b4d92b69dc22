"""Logging that says which cluster, controller and object a line is about.

mcruntime logs through the standard library. :class:`ReconcileContextFilter`
adds ``cluster``, ``controller``, ``namespace`` and ``object`` (the object's
name; ``name`` is the logger's on a LogRecord) to every record emitted during a
reconcile (from the contextvar the controller sets), whoever
logged it; :class:`JSONFormatter` writes one JSON object per line for log
pipelines. :func:`configure_logging` wires both for applications that want a
ready setup.
"""

from __future__ import annotations

import json
import logging
import sys
from typing import Literal

from .._reconcile.context import current_reconcile

_CONTEXT_FIELDS = ("cluster", "controller", "namespace", "object")


class ReconcileContextFilter(logging.Filter):
    """Adds the reconcile in progress to each record (empty strings outside a reconcile)."""

    def filter(self, record: logging.LogRecord) -> bool:
        context = current_reconcile()
        if context is None:
            for field in _CONTEXT_FIELDS:
                if not hasattr(record, field):
                    setattr(record, field, "")
            return True
        request = context.request
        record.cluster = request.cluster or "local"
        record.controller = context.controller
        record.namespace = request.namespace
        record.object = request.name
        return True


class JSONFormatter(logging.Formatter):
    """One JSON object per record: time, level, logger, message, reconcile context, exception."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "time": self.formatTime(record, "%Y-%m-%dT%H:%M:%S"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for field in ("cluster", "controller", "namespace", "object"):
            value = getattr(record, field, "")
            if value:
                entry[field] = value
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


class _TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        cluster = getattr(record, "cluster", "")
        if cluster:
            target = "/".join(
                part for part in (getattr(record, "namespace", ""), getattr(record, "object", "")) if part
            )
            line = (
                f"{line} [cluster={cluster} controller={getattr(record, 'controller', '')} object={target}]"
            )
        return line


def configure_logging(level: str | int = "INFO", format: Literal["text", "json"] = "text") -> logging.Handler:
    """Send the root logger to stderr with reconcile context on every line; returns the handler."""
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(ReconcileContextFilter())
    if format == "json":
        handler.setFormatter(JSONFormatter())
    else:
        handler.setFormatter(_TextFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.addHandler(handler)
    root.setLevel(level.upper() if isinstance(level, str) else level)
    return handler
