"""What a controller's workers wait on before they reconcile: the replica's share and its leadership.

Both are decided above the control layer (by the coordinator and the leader
elector); a controller knows them only as these two protocols, so it can be
gated without importing what gates it.
"""

from __future__ import annotations

from typing import Protocol


class RequestGate(Protocol):
    """Which clusters' requests this replica works on (the manager's :class:`WorkGate` when sharded)."""

    def admits(self, cluster: str) -> bool: ...


class LeaderGate(Protocol):
    """What workers wait on when leader election is on (the manager's elector)."""

    async def wait_elected(self) -> None: ...

    async def wait_lost(self) -> None: ...
