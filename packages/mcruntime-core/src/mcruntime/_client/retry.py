"""How hard to retry a request that may succeed a moment later, and what the server says about it.

The transport decides *whether* a request may be retried (only it knows if the
request reached the server); this module says *how*: which statuses are worth
another attempt, how long to wait (the one capped backoff, never less than the
server's Retry-After), and how many attempts to make.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from .._base.backoff import Backoff

RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})
"""Statuses a retry may cure: throttled, or the server (or a proxy in front of it) failing for now."""

_TYPED_PATCH_REFUSED = b"failed to create typed patch object"


def refused_for_good(status: int, body: bytes) -> bool:
    """A 5xx that answers the request itself, not the server's own trouble: asking again gets the same.

    Server-side apply of an object with a field its kind's schema lacks (a typo)
    is answered 500, "failed to create typed patch object ... field not declared
    in schema". Retried, it held a worker for seconds of backoff, and counted as
    the server failing in the cluster's health.
    """
    return status == 500 and _TYPED_PATCH_REFUSED in body[:1024]


@dataclass(frozen=True)
class RetryPolicy:
    """How hard to retry a request that may succeed a moment later."""

    attempts: int = 5
    base_delay: float = 0.2
    max_delay: float = 10.0

    def delay(self, attempt: int, retry_after: float | None = None) -> float:
        """Full-jitter capped backoff (the one :class:`Backoff`), never shorter than Retry-After."""
        backoff = Backoff(base=self.base_delay, cap=max(self.max_delay, self.base_delay), jitter=1.0)
        return max(backoff.delay(attempt), retry_after or 0.0)


def retry_after_seconds(headers: Mapping[str, str]) -> float | None:
    """The server's Retry-After in seconds (at most a minute), if it sent a usable one."""
    value = headers.get("Retry-After")
    if value is None:
        return None
    try:
        return min(float(value), 60.0)
    except ValueError:
        return None
