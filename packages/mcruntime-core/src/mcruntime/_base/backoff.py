"""The one backoff every retry loop uses: capped, jittered, overflow-safe.

A fleet runtime retries forever: an informer against a cluster that is down for
a day, a provider against a hub that lost its CRD. Every such loop asks a
:class:`Backoff` how long to wait after its ``n``-th consecutive failure. The
delay doubles from ``base`` up to ``cap`` and then stays there, however large
``n`` grows (``2**n`` is never computed for large ``n``, so the ten-thousandth
failure is as cheap and as safe as the first), and it is jittered so a fleet
of loops that failed together does not retry together.

Tests replace a loop's backoff with a zero-delay one (``Backoff(base=0, cap=0)``)
to drive thousands of failures through it in milliseconds.
"""

from __future__ import annotations

import asyncio
import math
import random
from dataclasses import dataclass

__all__ = ["Backoff"]


@dataclass(frozen=True)
class Backoff:
    """Delays of ``base * factor**failures`` seconds, at most ``cap``, with jitter.

    ``jitter`` is the share of each delay that is random: the delay is drawn
    from ``[d * (1 - jitter), d]``, so it never exceeds ``cap`` and never falls
    below half of ``d`` with the default. ``failures`` counts from 0: the wait
    after the first failure is about ``base``.
    """

    base: float = 0.2
    cap: float = 30.0
    factor: float = 2.0
    jitter: float = 0.5

    def __post_init__(self) -> None:
        if not (self.base >= 0 and self.cap >= self.base):
            raise ValueError(f"Backoff needs 0 <= base <= cap, got base={self.base!r} cap={self.cap!r}")
        if not self.factor >= 1:
            raise ValueError(f"Backoff factor must be at least 1, got {self.factor!r}")
        if not 0 <= self.jitter <= 1:
            raise ValueError(f"Backoff jitter must be between 0 and 1, got {self.jitter!r}")

    def ceiling(self, failures: int) -> float:
        """The delay after ``failures`` failures before jitter: never more than ``cap``."""
        if self.base == 0 or failures <= 0:
            return min(self.base, self.cap)
        if self.factor == 1:
            return self.base
        # The exponent at which the cap is reached; beyond it the answer is the cap,
        # so factor**failures is never computed for a large count (no OverflowError).
        # Computed in log space, so a tiny base and a huge factor cannot overflow either.
        exponent = math.log(self.cap) - math.log(self.base)
        step = math.log(self.factor)
        if failures * step >= exponent:
            return self.cap
        try:  # exact below the cap (5 ms doubles to exactly 10 ms), so delays compare equal
            return min(self.cap, self.base * self.factor**failures)
        except OverflowError:  # a subnormal base under a huge cap: the log form cannot overflow
            return min(self.cap, math.exp(math.log(self.base) + failures * step))

    def delay(self, failures: int) -> float:
        """The jittered wait after ``failures`` consecutive failures."""
        ceiling = self.ceiling(failures)
        if self.jitter == 0 or ceiling == 0:
            return ceiling
        return ceiling * (1.0 - self.jitter * random.random())  # noqa: S311 - jitter, not crypto

    async def sleep(self, failures: int, *, wake: asyncio.Event | None = None) -> float:
        """Wait the delay for ``failures``; returns early if ``wake`` is set meanwhile.

        ``wake`` lets a loop that waits out an outage resume as soon as
        something says the outage is over (a cluster's health probe succeeded),
        instead of sleeping out a long capped delay. Returns the delay chosen.
        """
        seconds = self.delay(failures)
        if wake is None:
            await asyncio.sleep(seconds)
            return seconds
        try:
            async with asyncio.timeout(seconds):
                await wake.wait()
        except TimeoutError:
            pass
        return seconds


DEFAULT_BACKOFF = Backoff()
"""Retry loops' default: 0.2 s doubling to 30 s, half jittered."""
