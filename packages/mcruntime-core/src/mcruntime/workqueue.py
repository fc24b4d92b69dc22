"""The controller's work queue and its rate limiters, for tuning a controller or using a queue alone.

A controller makes its own queue; these are for choosing its rate limiter
(``Builder.with_options(rate_limiter=...)``) or for a queue outside any
controller. Per-item retry delays come from the one capped :class:`~mcruntime.Backoff`.
"""

from __future__ import annotations

from ._control.ratelimit import ExponentialBackoff, MaxOf, RateLimiter, TokenBucket, default_rate_limiter
from ._control.workqueue import QueueMetrics, QueueShutDown, WorkQueue

__all__ = [
    "ExponentialBackoff",
    "MaxOf",
    "QueueMetrics",
    "QueueShutDown",
    "RateLimiter",
    "TokenBucket",
    "WorkQueue",
    "default_rate_limiter",
]
