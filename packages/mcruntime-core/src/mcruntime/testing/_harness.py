"""The conformance suite's machinery: a manager to run, what it saw, objects to see.

Each case runs the provider the way a user would, in a :class:`~mcruntime.Manager`
with a controller on ConfigMaps, and observes it from outside: which cluster
objects were engaged under which names (:class:`EngagementRecorder`), what the
reconciler read and from which cluster (:class:`Seen`). Objects live in a
namespace of the case's own in every control plane it uses, so cases can share
the session's clusters without seeing each other.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
import uuid
from collections import defaultdict
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import mcruntime as mcr

from ._controlplane import ControlPlane
from ._ending import ManagerWatch, expect_nothing_left
from ._running import running as run_manager
from ._running import tasks_left

CONFIGMAP = mcr.Kind("v1", "ConfigMap")
SEED_LABEL = "conformance.mcruntime.dev/case"
"""Every ConfigMap a case seeds carries this label with the case's own token."""


class EngagementRecorder:
    """An :class:`~mcruntime.Aware` that remembers every cluster object engaged under each name.

    Added to the manager, it is engaged like any controller, so it counts what
    the provider really handed over: a re-engagement is a new object under a
    name already seen.
    """

    def __init__(self) -> None:
        self.engaged: defaultdict[str, list[mcr.Cluster]] = defaultdict(list)
        self.engaged_at: defaultdict[str, list[float]] = defaultdict(list)
        """When (``time.monotonic()``) each object of :attr:`engaged` was engaged, in the same order."""
        self.stopped_at: dict[int, float] = {}
        """When each engaged cluster object (by ``id``; the recorder holds it) stopped: disengaged."""

    async def engage(self, name: str, cluster: mcr.Cluster) -> None:
        """Record ``cluster`` under ``name`` unless it is the object already recorded last."""
        history = self.engaged[name]
        if not history or history[-1] is not cluster:
            history.append(cluster)
            self.engaged_at[name].append(time.monotonic())
            cluster.on_stop(functools.partial(self._stopped, cluster))

    def _stopped(self, cluster: mcr.Cluster) -> None:
        self.stopped_at.setdefault(id(cluster), time.monotonic())

    def count(self, name: str) -> int:
        """How many distinct cluster objects were engaged under ``name``."""
        return len(self.engaged.get(name, []))

    def timeline(self, name: str) -> list[tuple[float, mcr.Cluster]]:
        """Every engagement under ``name``: when, and which object (a replacement is a new one)."""
        return list(zip(self.engaged_at.get(name, []), self.engaged.get(name, []), strict=True))

    def every_cluster(self) -> list[tuple[str, mcr.Cluster]]:
        return [(name, cluster) for name, history in self.engaged.items() for cluster in history]


class Seen:
    """What the case's reconciler read: ``(cluster, namespace, name) -> the seeded plane's name``."""

    def __init__(self) -> None:
        self.objects: dict[tuple[str, str, str], str | None] = {}
        self.calls: defaultdict[str, int] = defaultdict(int)

    def reconciler(self, manager: mcr.Manager) -> mcr.ReconcileFunction:
        """A reconciler that reads the request's object from the request's cluster."""

        async def reconcile(request: mcr.Request) -> None:
            self.calls[request.cluster] += 1
            cluster = await manager.get_cluster(request.cluster)
            obj = await cluster.cache.get_or_none(CONFIGMAP, request.name, namespace=request.namespace)
            key = (request.cluster, request.namespace, request.name)
            if obj is None:
                self.objects.pop(key, None)
            else:
                self.objects[key] = (obj.get("data") or {}).get("plane")

        return reconcile


class Seeder:
    """Writes the case's ConfigMaps into control planes, as their admin.

    Each ConfigMap says which control plane it lives in (``data.plane``), so a
    reconcile that read it proves which cluster it talked to.
    """

    def __init__(self) -> None:
        self.token: str = uuid.uuid4().hex[:10]
        self.namespace: str = f"conformance-{self.token}"
        self._admins: dict[str, mcr.Cluster] = {}

    async def _admin(self, plane: ControlPlane) -> mcr.Cluster:
        admin = self._admins.get(plane.name)
        if admin is None:
            config = mcr.kubeconfig_from_dict(plane.kubeconfig(), origin=f"{plane.name} admin")
            admin = mcr.Cluster(f"conformance-admin-{plane.name}", config)
            await admin.start()
            self._admins[plane.name] = admin
            with contextlib.suppress(mcr.AlreadyExists):
                await admin.client.create(
                    {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": self.namespace}}
                )
        return admin

    async def configmap(self, plane: ControlPlane, name: str) -> None:
        """Create ConfigMap ``name`` in the case's namespace of ``plane``."""
        admin = await self._admin(plane)
        await admin.client.create(
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": name, "namespace": self.namespace, "labels": {SEED_LABEL: self.token}},
                "data": {"plane": plane.name},
            }
        )

    async def close(self) -> None:
        await asyncio.gather(*(admin.stop() for admin in self._admins.values()))
        self._admins.clear()


def seed_index(obj: dict[str, Any]) -> list[str]:
    """Index function of the index cases: the case token of a seeded ConfigMap."""
    labels = (obj.get("metadata") or {}).get("labels") or {}
    value = labels.get(SEED_LABEL)
    return [value] if isinstance(value, str) else []


@asynccontextmanager
async def running(
    manager: mcr.Manager, recorder: EngagementRecorder, watch: ManagerWatch | None = None
) -> AsyncIterator[mcr.Manager]:
    """Run ``manager`` for the block; afterwards nothing may be left running or open.

    After shutdown, no task the block started is alive, and every cluster the
    provider ever engaged is stopped, owns no task, and has closed its
    connections: rule 5, "disengage completely", checked for every case and
    failed naming the clusters left (:func:`~._ending.expect_nothing_left`).

    With ``watch``, the manager's and the provider's tasks are watched from
    the moment the manager started, and a block that ends after the provider
    failed fails with :class:`~._ending.ProviderFailed`, which leads with the
    provider's error, not with the case's wait or the manager's shutdown; so
    does a block during which the provider's ``run()`` returned, even one
    that passed.
    """

    def admin_probe(task: asyncio.Task[object]) -> bool:
        # The seeder's own admin connections outlive the block on purpose (their health probes).
        return task.get_name().startswith("cluster conformance-admin-")

    before = asyncio.all_tasks()
    try:
        async with run_manager(manager, tasks_must_end=False):
            if watch is not None:
                watch.attach(manager, before)
            try:
                yield manager
            finally:
                if watch is not None:
                    watch.ending()
    except Exception as error:
        failed = watch.case_failed(error) if watch is not None else None
        if watch is None or failed is None:
            raise
        raise failed from watch.failure
    if watch is not None and watch.ended:  # run() returned early, and the case passed all the same
        raise watch.failed("while the case ran") from watch.failure
    expect_nothing_left(tasks_left(before, admin_probe), recorder.every_cluster())
