"""Lease objects on the hub, and judging their expiry by local observation.

Leader election and sharding both coordinate replicas through
coordination.k8s.io/v1 Leases. Neither ever compares a Lease's timestamps
with the local clock (replicas' clocks may disagree): a Lease is expired when
*this* replica has watched it stay unchanged for a full term, measured on its
own monotonic clock. :class:`Observed` keeps that record for one Lease.
(Sharding also takes a peer's word for it, naming the ``resourceVersion`` it
watched unchanged: versions are compared for equality only; see membership.py.)
"""

from __future__ import annotations

import datetime
import socket
import time
import uuid
from dataclasses import dataclass
from typing import Any

from .._base.kind import Kind
from .._base.objects import JSON

LEASE = Kind("coordination.k8s.io/v1", "Lease")


def micro_time(moment: datetime.datetime | None = None) -> str:
    """A Lease's MicroTime: RFC 3339 in UTC with microseconds."""
    value = moment or datetime.datetime.now(datetime.UTC)
    return value.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def default_identity() -> str:
    """Host name plus a random suffix: unique per process, readable in ``kubectl get lease``."""
    return f"{socket.gethostname()}_{uuid.uuid4().hex[:8]}"


def lease_object(
    name: str,
    namespace: str,
    holder: str,
    duration: float,
    *,
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
) -> JSON:
    """A fresh Lease held by ``holder`` (``""`` for a free one), acquired and renewed now."""
    now = micro_time()
    metadata: dict[str, Any] = {"name": name, "namespace": namespace}
    if labels:
        metadata["labels"] = dict(labels)
    if annotations:
        metadata["annotations"] = dict(annotations)
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": metadata,
        "spec": {
            "holderIdentity": holder,
            "leaseDurationSeconds": max(1, round(duration)),
            "acquireTime": now,
            "renewTime": now,
            "leaseTransitions": 0,
        },
    }


def spec_of(lease: JSON) -> dict[str, Any]:
    """The Lease's spec as a fresh dict; a garbled spec reads as an empty one."""
    spec = lease.get("spec")
    return dict(spec) if isinstance(spec, dict) else {}


def holder_of(lease: JSON) -> str:
    return str(spec_of(lease).get("holderIdentity") or "")


def renew_time_of(lease: JSON) -> str:
    return str(spec_of(lease).get("renewTime") or "")


def version_of(lease: JSON) -> str:
    """The Lease's ``resourceVersion`` (``""`` if it has none): equal only if nobody wrote it since."""
    meta = lease.get("metadata")
    return str(meta.get("resourceVersion") or "") if isinstance(meta, dict) else ""


def transitions_of(spec: dict[str, Any]) -> int:
    """``leaseTransitions``, tolerating a garbled value (counted as 0)."""
    try:
        return int(str(spec.get("leaseTransitions") or 0))
    except ValueError:
        return 0


def take(lease: JSON, identity: str, duration: float) -> JSON:
    """``lease`` rewritten as held by ``identity`` from now (its resourceVersion kept)."""
    spec = spec_of(lease)
    now = micro_time()
    if str(spec.get("holderIdentity") or "") != identity:
        spec["leaseTransitions"] = transitions_of(spec) + 1
        spec["acquireTime"] = now
    spec.update(holderIdentity=identity, leaseDurationSeconds=max(1, round(duration)), renewTime=now)
    return {**lease, "spec": spec}


def released(lease: JSON) -> JSON:
    """``lease`` rewritten as free (no holder), so a waiting replica may take it at once."""
    spec = spec_of(lease)
    spec.update(holderIdentity="", leaseDurationSeconds=1, renewTime=micro_time())
    return {**lease, "spec": spec}


@dataclass
class Observed:
    """What one Lease looked like when this replica last saw it change, and when that was.

    ``since`` is this replica's monotonic time of the last change of holder or
    renewal it observed: the only clock an expiry is ever judged by.
    """

    holder: str
    renew_time: str
    since: float

    def see(self, holder: str, renew_time: str, now: float | None = None) -> bool:
        """Record a fresh reading; returns whether the holder or renewal changed."""
        if (holder, renew_time) == (self.holder, self.renew_time):
            return False
        self.holder, self.renew_time = holder, renew_time
        self.since = time.monotonic() if now is None else now
        return True

    def quiet_for(self, now: float | None = None) -> float:
        """Seconds this replica has watched the Lease unchanged."""
        return (time.monotonic() if now is None else now) - self.since
