"""The coordination machinery: who among a program's replicas works on which clusters.

A program chooses with :class:`mcruntime.LeaderElectionConfig` (one active
replica) or :class:`mcruntime.ShardedCoordinator` and
:class:`mcruntime.ShardingConfig` (clusters shared out among replicas); these
name what runs underneath, for code that drives or implements it: the
:class:`Coordinator` protocol a manager consults, and the
:class:`LeaderElector` that holds a Lease. Kept out of ``mcruntime``'s root so
the root stays the runtime a program wires together.

:class:`Fenced` is what a reconcile's write raises, unsent, once the replica's
share (or its leadership) has lapsed; the controller queues that request again
and a sharded gate drops it if the cluster moved away, so a reconciler meets it
only if it catches errors itself.
"""

from __future__ import annotations

from ._base.errors import Fenced
from ._coordination.coordinator import Coordinator
from ._coordination.leaderelection import LeaderElector

__all__ = ["Coordinator", "Fenced", "LeaderElector"]
