"""When a cluster counts as ready, and what ``/readyz`` says about the fleet.

A cluster is ready when its own health record says it answers, none of its
loops is failing, it has the permissions its informers need, none of its
informers keeps failing (a kind it no longer serves), and every controller
has synced its caches there. The fleet is ready when every member
is (or, with ``ready_min_share`` below 1, that share of them): one broken
cluster among many must not take every replica out of its Service.

Event writes refused by RBAC are shown, on an ``events:NAME`` line of their
own, and not counted: an Event is best-effort (the recorder drops what it
cannot write), and a leader whose every real write succeeds must not leave its
Service, and its webhooks' Service, over one.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Mapping

from .._client.health import HealthState
from .._control.controller import Controller
from .._fleet.cluster import Cluster
from .._fleet.status import ClusterPhase, ClusterStatus, forbidden
from .._reconcile.request import LOCAL_CLUSTER
from .serving import CheckLine


def lifecycle_problem(started: asyncio.Event, stopping: asyncio.Event) -> str | None:
    """Why a manager is not ready while it starts or stops, or ``None`` while it runs.

    Its endpoints serve from the start's first step, before the hub cluster
    and the provider are up: with no cluster engaged yet, no other line could
    fail. A stopping manager takes no new work, so it leaves its Service too.
    """
    if stopping.is_set():
        return "shutting down"
    if not started.is_set():
        return "starting: the hub cluster and the provider are not up yet"
    return None


def cluster_not_ready(name: str, cluster: Cluster, controllers: Iterable[Controller]) -> str | None:
    """Why cluster ``name`` is not ready yet, or ``None`` if it is.

    The cluster's own health record decides reachability, exactly as
    statuses() and the metrics read it. A controller that has not engaged the
    cluster yet counts as waiting too: the manager records a cluster before
    its fan-out reaches every controller.
    """
    health = cluster.health
    if health.state is HealthState.UNHEALTHY:
        return f"unhealthy: {health.reason}"
    if health.state is HealthState.UNKNOWN:
        return "no answer from its health probe yet" + (f"; {health.waiting}" if health.waiting else "")
    trouble = cluster.trouble()
    if trouble is not None:
        return trouble
    waiting = [controller.name for controller in controllers if not controller.synced(name)]
    if waiting:
        return f"caches not synced for {', '.join(sorted(waiting))}"
    return None


def readiness_lines(
    statuses: Mapping[str, ClusterStatus],
    engaged: Mapping[str, Cluster],
    ready_min_share: float,
    not_ready: Callable[[str, Cluster], str | None],
) -> list[CheckLine]:
    """One ``/readyz`` line per cluster known to the provider or engaged, and the share line."""
    lines: list[CheckLine] = []
    members = 0
    passing = 0
    known: dict[str, Cluster | None] = dict.fromkeys(statuses)
    known.update(engaged)
    for name, cluster in sorted(known.items()):
        status = statuses.get(name)
        if cluster is None and status is not None and status.phase is ClusterPhase.FAILED:
            # Never engaged: shown, so an operator sees it, but there is nothing to be ready.
            lines.append((f"cluster:{name}", f"never engaged: {status.error}", False))
            continue
        if cluster is not None:
            reason = not_ready(name, cluster)
        elif status is not None and status.error:  # known, not engaged, and the provider says why
            reason = f"not engaged: {status.error}"
        else:
            reason = "engaging"
        label = "local" if name == LOCAL_CLUSTER else name
        refused = cluster.health.refused_events if cluster is not None else ()
        events = [(f"events:{label}", f"{forbidden(refused)} (best-effort: shown, not counted)", False)]
        if name == LOCAL_CLUSTER:
            lines.extend([("cluster:local", reason, True), *(events if refused else [])])
            continue
        members += 1
        passing += reason is None
        lines.extend([(f"cluster:{name}", reason, ready_min_share >= 1.0), *(events if refused else [])])
    if 0.0 < ready_min_share < 1.0 and members:
        share = passing / members
        reason = (
            None
            if share >= ready_min_share
            else (f"{passing} of {members} clusters ready, {ready_min_share:.0%} required")
        )
        lines.append(("clusters", reason, True))
    return lines
