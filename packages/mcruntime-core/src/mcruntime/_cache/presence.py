"""Whether an informer's kind may be missing from its cluster, and whether it is.

A fleet differs by design: a CRD installed on some members only. A controller
that says so for a kind (``for_(kind, optional=True)``) must not keep
``/readyz`` failing for every member that lacks it, while a controller that
needs the kind must still see the same absence as a failure. The informer is
shared by both, so it counts who holds it which way.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable

from .._base.errors import KindNotFound


class KindPresence:
    """Who accepts the kind's absence, who needs it, and whether the cluster lacks it now."""

    def __init__(self) -> None:
        self._optional = 0
        self._required = 0
        self.absent: asyncio.Event = asyncio.Event()
        """Set while the cluster serves no such kind (the informer failing with KindNotFound)."""

    def hold(self, *, optional: bool) -> Callable[[], None]:
        """Count one source; call what is returned when it detaches (once)."""
        if optional:
            self._optional += 1
        else:
            self._required += 1
        released = False

        def release() -> None:
            nonlocal released
            if released:
                return
            released = True
            if optional:
                self._optional -= 1
            else:
                self._required -= 1

        return release

    @property
    def may_be_absent(self) -> bool:
        """Whether every source holding the kind said it may be missing (and at least one did)."""
        return self._optional > 0 and self._required == 0

    def found(self, failures: Iterable[Exception]) -> None:
        """Follow the informer's failures: absent while one of them is KindNotFound."""
        if any(isinstance(failure, KindNotFound) for failure in failures):
            self.absent.set()
        else:
            self.absent.clear()
