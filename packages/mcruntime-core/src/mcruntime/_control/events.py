"""Kubernetes Events for ``kubectl describe``, written into the object's own cluster.

A recorder belongs to one controller; each event goes to the cluster of the
object it is about (by default the cluster of the request being reconciled), so
an event about a Job in ``east`` is seen in ``east`` and nowhere else. Events
are ``events.k8s.io/v1``; a repeat of an identical event (same object, type,
reason, action and note) within six minutes updates the first one's series
count instead of writing a new object, as client-go's recorder does, so a
controller stuck in a retry loop cannot flood the API server. Recording never
fails a reconcile: errors are logged, once per cluster when recording there
starts failing (and again if it fails another way), and once when it works
again, never per event: a controller that records an event per reconcile
would otherwise log a refusal (events create forbidden) dozens of times a
second. The repeats go to DEBUG.
"""

from __future__ import annotations

import datetime
import logging
import time
import uuid
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from .._base.errors import MCRuntimeError, NotFound
from .._base.kind import Kind
from .._base.objects import metadata
from .._reconcile.context import current_request

if TYPE_CHECKING:
    from .._fleet.cluster import Cluster

log = logging.getLogger("mcruntime.events")
EVENT = Kind("events.k8s.io/v1", "Event")
_SERIES_WINDOW = 6 * 60.0
_MAX_TRACKED = 4096


def _micro_time() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass
class _Series:
    cluster: str
    namespace: str
    name: str
    count: int
    last: float


class EventRecorder:
    """Records events for one controller (``reporting_controller``) into each object's cluster."""

    def __init__(
        self,
        controller: str,
        lookup: Callable[[str], Awaitable[Cluster]],
        *,
        instance: str | None = None,
    ) -> None:
        self.controller = controller
        self.instance: str = instance or f"{controller}-{uuid.uuid4().hex[:8]}"
        self._lookup = lookup
        self._series: OrderedDict[tuple[str, ...], _Series] = OrderedDict()
        # Clusters where recording fails now → the kind of failure last logged (bounded like
        # the series: a cluster that left while failing must not be kept forever).
        self._failing: OrderedDict[str, str] = OrderedDict()

    async def event(
        self,
        regarding: Mapping[str, Any],
        type: Literal["Normal", "Warning"],
        reason: str,
        note: str,
        *,
        action: str = "Reconcile",
        cluster: str | None = None,
    ) -> None:
        """Record ``reason``/``note`` about ``regarding`` in ``cluster`` (default: the request's)."""
        request = current_request()
        target = cluster if cluster is not None else (request.cluster if request is not None else None)
        if target is None:
            raise MCRuntimeError("no cluster given and no reconcile in progress to take it from")
        meta = metadata(regarding)
        namespace = meta.get("namespace") or "default"
        key = (
            target,
            namespace,
            str(regarding.get("kind")),
            str(meta.get("name")),
            str(meta.get("uid")),
            type,
            reason,
            action,
            note,
        )
        try:
            cluster_object = await self._lookup(target)
            series = self._series.get(key)
            now = time.monotonic()
            if (
                series is not None
                and now - series.last < _SERIES_WINDOW
                and await self._bump(cluster_object, series, now)
            ):
                self._series.move_to_end(key)
            else:
                name = f"{meta.get('name', 'object')}.{uuid.uuid4().hex[:16]}"
                await cluster_object.client.create(
                    self._manifest(regarding, namespace, name, type, reason, note, action)
                )
                self._series[key] = _Series(target, namespace, name, 1, now)
                while len(self._series) > _MAX_TRACKED:
                    self._series.popitem(last=False)
        except Exception as error:
            self._failed(target, reason, meta.get("name"), error)
            return
        if self._failing.pop(target, None) is not None:
            log.info("controller %r: events are recorded in cluster %r again", self.controller, target)

    def _failed(self, target: str, reason: str, name: object, error: Exception) -> None:
        """Log a failure once per cluster and kind of failure; repeats go to DEBUG."""
        kind = type(error).__name__
        if self._failing.get(target) == kind:
            log.debug("could not record event %s for %s in cluster %r: %s", reason, name, target, error)
            return
        self._failing[target] = kind
        self._failing.move_to_end(target)
        while len(self._failing) > _MAX_TRACKED:
            self._failing.popitem(last=False)
        log.warning(
            "controller %r: could not record event %s for %s in cluster %r: %s; events there are dropped "
            "(recording never fails a reconcile), and this is logged again only when recording works again "
            "or fails another way",
            self.controller,
            reason,
            name,
            target,
            error,
        )

    async def _bump(self, cluster: Cluster, series: _Series, now: float) -> bool:
        """Count a repeat into the series' Event; False when that Event is gone.

        The API server expires Events (an hour by default) while a series may recur for
        longer, and a user may delete them; then the repeat is recorded as a new Event and
        a new series, not dropped.
        """
        patch = {"series": {"count": series.count + 1, "lastObservedTime": _micro_time()}}
        try:
            await cluster.client.patch(EVENT, series.name, patch, namespace=series.namespace)
        except NotFound:
            return False
        series.count += 1
        series.last = now
        return True

    def _manifest(
        self,
        regarding: Mapping[str, Any],
        namespace: str,
        name: str,
        type: str,
        reason: str,
        note: str,
        action: str,
    ) -> dict[str, Any]:
        meta = metadata(regarding)
        reference = {
            key: value
            for key, value in (
                ("apiVersion", regarding.get("apiVersion")),
                ("kind", regarding.get("kind")),
                ("name", meta.get("name")),
                ("namespace", meta.get("namespace")),
                ("uid", meta.get("uid")),
                ("resourceVersion", meta.get("resourceVersion")),
            )
            if value
        }
        return {
            "apiVersion": "events.k8s.io/v1",
            "kind": "Event",
            "metadata": {"name": name, "namespace": namespace},
            "eventTime": _micro_time(),
            "reportingController": self.controller,
            "reportingInstance": self.instance,
            "action": action,
            "reason": reason,
            "note": note[:1024],
            "type": type,
            "regarding": reference,
        }
