"""The conformance suite's checks: every failure names the rule it breaks and what was seen.

A bare ``assert a is b`` in a provider's test run says nothing a provider's
author can act on (``<Cluster 'alpha' started> is <Cluster 'alpha' stopped>``).
Each check here names the rule of ``docs/guides/writing-a-provider.md`` it
enforces, and the message says what the suite saw instead.
"""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable

import mcruntime as mcr

from ._running import wait_until

GUIDE = "docs/guides/writing-a-provider.md"

CONTRACT = "the Provider contract (get and engage agree, one status per cluster)"
GONE = "rule 1, only the source says gone"
ISOLATED = "rule 2, one cluster's trouble is its own"
CONTENT = "rule 3, re-engage on content, never on events"
NAMES = "rule 4, names are stable and documented"
DISENGAGE = "rule 5, disengage completely"
CREDENTIALS = "rule 7, credentials stay out of sight"


class RuleBroken(AssertionError):
    """A conformance case failed: the message names the rule and what was seen."""


def expect(condition: object, rule: str, seen: str) -> None:
    """Fail the case with ``rule`` and ``seen`` unless ``condition`` holds."""
    if not condition:
        raise RuleBroken(f"{rule} (see {GUIDE}): {seen}")


def describe(cluster: mcr.Cluster | None) -> str:
    """A cluster as a failure message shows it: which object, and whether it still runs."""
    if cluster is None:
        return "not engaged"
    state = "stopped" if cluster.stopped else "running"
    return f"{cluster!r} (object {id(cluster):#x}, {state})"


def same_secret(actual: str | None, expected: str) -> bool:
    """Compare credentials without letting either reach an assertion message."""
    return actual is not None and hmac.compare_digest(actual.encode(), expected.encode())


async def eventually(
    condition: Callable[[], object | Awaitable[object]],
    rule: str,
    what: str,
    *,
    seen: Callable[[], str] | None = None,
    timeout: float = 30.0,
) -> None:
    """Wait like :func:`~mcruntime.testing.wait_until`, but a timeout is a broken ``rule``.

    A bare "not within 30s: cluster 'beta' reported unhealthy" leaves the
    author guessing which rule failed and why; ``seen`` says what was there
    instead (a cluster never engaged, the status it had), read at the deadline.
    """
    try:
        await wait_until(condition, timeout=timeout, what=what)
    except AssertionError as error:
        if not str(error).startswith("not within "):
            raise  # the condition's own assertion, not the deadline
        instead = f"; {seen()}" if seen is not None else ""
        raise RuleBroken(f"{rule} (see {GUIDE}): not within {timeout:g}s: {what}{instead}") from None
