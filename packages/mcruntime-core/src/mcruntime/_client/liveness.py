"""Whether an API server answers, known once for every cluster that reaches it.

A fleet often holds many clusters per API server (a token user per tenant).
Whether the server answers at all is a fact about the server, not about each
cluster: probing it once per cluster costs idle CPU that grows with the fleet
and, at a cold start, a burst of probes that can time out behind each other.
One :class:`ServerLiveness` per endpoint (server, CA, proxy, TLS server name)
and event loop gathers the evidence of all its clusters instead:

- any answer to any of its clusters (a response of any status, a watch event
  or bookmark) makes the server *heard*: nobody needs to probe it for one
  probe interval;
- only the *lead* member (the first cluster whose probe loop joined) probes
  reachability, and only once the server has been silent for a whole interval;
- a probe that gets no answer from the server itself (a timeout, a refused
  connection) opens the circuit of every member, and the first answer any of
  them gets closes every circuit again.

Whether each cluster's *credential* still works stays per cluster (see
:mod:`mcruntime._client.health`): an answer to one token says nothing about
another.
"""

from __future__ import annotations

import asyncio
import time
import weakref
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .health import HealthRecord


class ServerLiveness:
    """The shared reachability of one API server: when it last answered, who probes it."""

    def __init__(self, key: str) -> None:
        self.key: str = key
        self.heard_at: float = float("-inf")
        """``time.monotonic()`` of the last answer any member got from the server."""
        self.probes: int = 0
        """Reachability probes made on behalf of the whole server (for tests and metrics)."""
        self._members: dict[HealthRecord, None] = {}
        self._outage: str | None = None

    def __repr__(self) -> str:
        return f"<ServerLiveness members={len(self._members)} outage={self._outage is not None}>"

    # --- membership ---------------------------------------------------------------------

    def join(self, record: HealthRecord) -> None:
        self._members[record] = None
        if self._outage is not None:
            record.server_outage(self._outage)

    def leave(self, record: HealthRecord) -> None:
        was_lead = self.lead is record
        self._members.pop(record, None)
        if not self._members:
            _registry_forget(self)
        elif was_lead:
            lead = self.lead
            assert lead is not None
            lead.wake()  # the duty to probe the server moves on; it must not wait a credential interval

    @property
    def lead(self) -> HealthRecord | None:
        """The member that probes reachability for all of them."""
        return next(iter(self._members), None)

    def __len__(self) -> int:
        return len(self._members)

    # --- evidence ---------------------------------------------------------------------

    def heard(self, now: float | None = None) -> None:
        """Some member got an answer: the server is there, so every open circuit of it closes."""
        self.heard_at = time.monotonic() if now is None else now
        if self._outage is not None:
            self._outage = None
            for member in list(self._members):
                member.server_answered(self.heard_at)

    def silent_for(self, now: float) -> float:
        return now - self.heard_at

    @property
    def outage(self) -> str | None:
        """Why the server is unreachable for all its members, or ``None``."""
        return self._outage

    def unreachable(self, reason: str) -> None:
        """A probe got no answer from the server itself: fail fast for every member."""
        if self._outage is not None:
            return
        self._outage = reason
        for member in list(self._members):
            member.server_outage(reason)


_registries: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, ServerLiveness]] = (
    weakref.WeakKeyDictionary()
)


def server_liveness(key: str) -> ServerLiveness:
    """The running event loop's record for the server of endpoint fingerprint ``key``."""
    loop = asyncio.get_running_loop()
    registry = _registries.get(loop)
    if registry is None:
        registry = _registries[loop] = {}
    found = registry.get(key)
    if found is None:
        found = registry[key] = ServerLiveness(key)
    return found


def _registry_forget(server: ServerLiveness) -> None:
    try:
        registry = _registries.get(asyncio.get_running_loop())
    except RuntimeError:
        return
    if registry is not None and registry.get(server.key) is server:
        del registry[server.key]
