"""The webhook server's metrics, under controller-runtime's names so its dashboards read them.

``controller_runtime_webhook_requests_total{webhook,code}``,
``controller_runtime_webhook_latency_seconds{webhook}`` and
``controller_runtime_webhook_requests_in_flight{webhook}``. ``webhook`` is a
registered webhook's path without its cluster (``/validate/apps/v1/Deployment``):
the calls of every cluster add up in one series, so a fleet of thousands of
clusters does not make thousands of series. A call for no registered webhook
counts as ``unmatched``, so a client inventing paths cannot grow ``/metrics``.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable
from typing import TYPE_CHECKING

from .._base.metric import Metrics

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from .exchange import Reply

UNMATCHED = "unmatched"
"""The ``webhook`` label of a call for a path no webhook is registered at."""
_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class WebhookMetrics:
    """Counts, times and gauges each call; bound to one manager's registry."""

    def __init__(self, registry: CollectorRegistry) -> None:
        metric = Metrics(registry)
        self._total = metric.counter(
            "controller_runtime_webhook_requests_total",
            "Webhook calls answered, by webhook path and HTTP status",
            ("webhook", "code"),
        )
        self._latency = metric.histogram(
            "controller_runtime_webhook_latency_seconds",
            "Time from a webhook call's headers to its answer",
            ("webhook",),
            buckets=_BUCKETS,
        )
        self._in_flight = metric.gauge(
            "controller_runtime_webhook_requests_in_flight", "Webhook calls being answered", ("webhook",)
        )

    async def measure(self, webhook: str, answer: Awaitable[Reply]) -> Reply:
        """Await ``answer`` as one call of ``webhook``, counted when it is answered."""
        flying = self._in_flight.labels(webhook)
        flying.inc()
        started = time.perf_counter()
        try:
            reply = await answer
        finally:
            flying.dec()
        self._latency.labels(webhook).observe(time.perf_counter() - started)
        self._total.labels(webhook, str(reply.status)).inc()
        return reply
