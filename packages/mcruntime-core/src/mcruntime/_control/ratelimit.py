"""Rate limiters: how long a failed request waits before the work queue retries it.

A controller that keeps failing on one object must back off, so a broken object
does not spin a worker; and the whole controller must not retry faster than the
API servers can take, however many objects fail at once. A ``RateLimiter``
answers one question per retry, "how many seconds until this item may run
again?", and the work queue schedules the retry that far ahead.

The defaults match controller-runtime's: a per-item exponential backoff from
5 ms to 1000 s, combined with an overall token bucket of 10 retries a second
with bursts of 100 (``default_rate_limiter()``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable
from typing import Protocol

from .._base.backoff import Backoff

__all__ = [
    "ExponentialBackoff",
    "MaxOf",
    "RateLimiter",
    "TokenBucket",
    "default_rate_limiter",
]


class RateLimiter(Protocol):
    """Decides how long an item waits before it is retried.

    A limiter may keep state per item (its failure count) or overall (tokens);
    the work queue calls ``when`` once per rate-limited retry, so every call
    counts as one more failure of that item.
    """

    def when(self, item: Hashable) -> float:
        """Record one more retry of ``item`` and return the seconds it must wait (>= 0)."""
        ...

    def forget(self, item: Hashable) -> None:
        """Drop what is known about ``item``: it succeeded, or it no longer matters."""
        ...

    def retries(self, item: Hashable) -> int:
        """How many retries of ``item`` have been recorded since it was last forgotten."""
        ...


class ExponentialBackoff:
    """Per-item backoff: the one capped :class:`~mcruntime.Backoff`, counted per item, without jitter.

    The first retry of an item waits ``base``, each further one twice as long,
    until ``forget`` resets it. With the defaults an item waits 5 ms, 10 ms,
    20 ms, ..., and 1000 s from its 19th retry on. Items are independent: one
    item's failures never slow another. The delays are ``Backoff.ceiling``'s:
    this class only keeps the count per item.

    Args:
        base: seconds the first retry waits; must be positive.
        cap: the longest wait, in seconds; at least ``base``.
    """

    def __init__(self, base: float = 0.005, cap: float = 1000.0) -> None:
        if not base > 0:
            raise ValueError(f"base must be positive, got {base!r}")
        if not cap >= base:
            raise ValueError(f"cap must be at least base ({base!r}), got {cap!r}")
        self.base = base
        self.cap = cap
        self._backoff = Backoff(base=base, cap=cap, factor=2.0, jitter=0.0)
        self._failures: dict[Hashable, int] = {}

    def when(self, item: Hashable) -> float:
        """Count a failure of ``item`` and return its backoff, capped at ``cap``."""
        exponent = self._failures.get(item, 0)
        self._failures[item] = exponent + 1
        return self._backoff.ceiling(exponent)

    def forget(self, item: Hashable) -> None:
        """Reset ``item``: its next retry waits ``base`` again."""
        self._failures.pop(item, None)

    def retries(self, item: Hashable) -> int:
        """Failures of ``item`` counted since it was last forgotten."""
        return self._failures.get(item, 0)


class TokenBucket:
    """An overall limit on retries: ``rate`` a second on average, ``burst`` at once.

    The bucket holds up to ``burst`` tokens and refills at ``rate`` tokens a
    second; it starts full. Each ``when`` takes one token, borrowing from the
    future when the bucket is empty, and returns how long until that token
    exists. So a burst of retries goes through at once and the ones beyond it
    are spread out at ``rate`` a second, whichever items they are for. It keeps
    no per-item state: ``forget`` does nothing and ``retries`` is always 0.

    Args:
        rate: tokens added per second; must be positive.
        burst: the bucket's size; at least 1.
        clock: a monotonic time source in seconds; tests inject a fake one.
    """

    def __init__(
        self,
        rate: float = 10.0,
        burst: int = 100,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not rate > 0:
            raise ValueError(f"rate must be positive, got {rate!r}")
        if burst < 1:
            raise ValueError(f"burst must be at least 1, got {burst!r}")
        self.rate = rate
        self.burst = burst
        self._clock = clock
        self._tokens = float(burst)
        self._updated = clock()

    def when(self, item: Hashable) -> float:
        """Reserve a token and return the seconds until it is available (0 if now)."""
        self._refill()
        self._tokens -= 1.0
        if self._tokens >= 0.0:
            return 0.0
        return -self._tokens / self.rate

    def forget(self, item: Hashable) -> None:
        """Nothing to forget: the bucket is shared by all items."""

    def retries(self, item: Hashable) -> int:
        """Always 0: the bucket does not count retries per item."""
        return 0

    def _refill(self) -> None:
        now = self._clock()
        elapsed = max(0.0, now - self._updated)  # a clock that steps back adds nothing
        self._updated = now
        self._tokens = min(float(self.burst), self._tokens + elapsed * self.rate)


class MaxOf:
    """Combines limiters: an item waits as long as the strictest of them says.

    Every limiter sees every ``when`` (so each keeps its own count), and the
    longest delay wins. ``forget`` reaches all of them; ``retries`` is the
    highest count any of them keeps.

    Args:
        *limiters: at least one limiter.
    """

    def __init__(self, *limiters: RateLimiter) -> None:
        if not limiters:
            raise ValueError("MaxOf needs at least one rate limiter")
        self.limiters: tuple[RateLimiter, ...] = limiters

    def when(self, item: Hashable) -> float:
        """Ask every limiter (each records the retry) and return the longest delay."""
        return max(limiter.when(item) for limiter in self.limiters)

    def forget(self, item: Hashable) -> None:
        """Forget ``item`` in every limiter."""
        for limiter in self.limiters:
            limiter.forget(item)

    def retries(self, item: Hashable) -> int:
        """The highest retry count any limiter keeps for ``item``."""
        return max(limiter.retries(item) for limiter in self.limiters)


def default_rate_limiter() -> MaxOf:
    """controller-runtime's default: per-item 5 ms..1000 s backoff, overall 10/s with bursts of 100."""
    return MaxOf(ExponentialBackoff(), TokenBucket())
