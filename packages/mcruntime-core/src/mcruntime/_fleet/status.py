"""What a provider reports: one status shape for every cluster and every source.

Operators ask two questions of a provider: "is cluster X working, and if not,
why?" and "what did you make of the things you read?". :class:`ClusterStatus`
answers the first, by cluster name; :class:`SourceStatus` the second, one per
file, context, Secret or object the provider read. A cluster's status carries
the source it was built from, so the path from "unhealthy" to "which Secret,
which version, what is wrong with it" is one attribute away, the same for every
provider. Both are frozen snapshots: a copy a caller keeps never changes.
"""

from __future__ import annotations

import enum
import types
from collections.abc import Mapping
from dataclasses import dataclass, field

_NO_DETAIL: Mapping[str, str] = types.MappingProxyType({})


class ClusterPhase(enum.Enum):
    """Where a cluster is in its provider's lifecycle (its API server's health is :class:`HealthState`)."""

    ENGAGING = "engaging"
    """Handed to the runtime, not yet probed (or not yet handed to the manager)."""
    READY = "ready"
    """Engaged and answering its health probe; every loop of it alive."""
    UNHEALTHY = "unhealthy"
    """Engaged but failing its probe or a loop; kept, never treated as gone."""
    FAILED = "failed"
    """Named by a source whose config could not be used, and never engaged: see ``source.error``."""


# --8<-- [start:source-status]
@dataclass(frozen=True)
class SourceStatus:
    """One thing a provider read (a file's context, a Secret, a Cluster object) and what it made of it.

    ``kind`` and ``name`` say where to look (``"Secret"``, ``"ns/name"``);
    ``cluster`` is the cluster name the source claims (``None`` when it names
    none, as an unreadable file); ``engaged`` says whether the engaged cluster
    of that name runs on this source's config. ``error`` says why its current
    version is not used; ``stale`` means the cluster still runs on an earlier
    version that worked. ``version`` is the version read (a resourceVersion, a
    digest). ``detail`` holds what only this provider knows (``duplicate_of``,
    a Secret's version, ``ready``), as strings, read-only.

    Statuses name sources and say what is wrong; they never quote a
    credential or a file's content.
    """

    kind: str
    name: str
    cluster: str | None = None
    engaged: bool = False
    version: str | None = None
    error: str | None = None
    stale: bool = False
    detail: Mapping[str, str] = field(default_factory=lambda: _NO_DETAIL, hash=False)

    def __post_init__(self) -> None:
        # Frozen all the way down: a snapshot's detail cannot be changed through a kept copy.
        if not isinstance(self.detail, types.MappingProxyType):
            object.__setattr__(self, "detail", types.MappingProxyType(dict(self.detail)))


# --8<-- [end:source-status]


@dataclass(frozen=True)
class ClusterStatus:
    """A snapshot of one cluster: its phase, why, since when, how often it changed, and its source.

    ``phase`` comes from the cluster's health record (the probe's verdict), so
    it agrees with ``/readyz`` and the metrics: engaging until the cluster is
    handed to the manager and first probed, then ready or unhealthy. A cluster
    a source names but whose config was never usable is ``FAILED``, and its
    ``source`` says why. ``source`` is ``None`` for providers that do not
    report sources.
    """

    name: str
    phase: ClusterPhase
    since: float
    error: str | None = None
    engagements: int = 1
    credential_rotations: int = 0
    source: SourceStatus | None = None
    missing_permissions: tuple[str, ...] = ()
    """What the server refuses this program with 403 (verb, kind, namespace): the RBAC to grant.

    While any is missing the cluster is ``UNHEALTHY`` and ``error`` names them;
    they clear, without a restart, when the refused request succeeds.
    """
    refused_events: tuple[str, ...] = ()
    """Event writes refused with 403: shown here and in ``/readyz``, never counted (Events are best-effort).

    The cluster's ``phase`` does not change for them; they clear like
    :attr:`missing_permissions`.
    """


def forbidden(missing: tuple[str, ...]) -> str:
    """The one wording of missing permissions in ``statuses()`` and ``/readyz``."""
    return "forbidden by RBAC: " + "; ".join(missing)
