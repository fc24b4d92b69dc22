"""Nothing grows with churn: a thousand uniquely named clusters come and go, and every trace goes too.

A fleet runtime lives for months while clusters are created and deleted under
names it never sees again. Everything keyed by a cluster name (metric series,
the manager's and the ClusterSet's bookkeeping, a controller's engagements and
queue groups) must leave with its cluster, or memory and every ``/metrics``
scrape grow without bound. The clusters here all point at two testbed API
servers under distinct names; a controller watches a ConfigMap in each, so
every cluster really starts, syncs a cache, reconciles and is torn down.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from typing import Any

import aiohttp
import pytest

import mcruntime as mcr
from mcruntime.testing import Fleet, running, wait_until

# When the suite runs in parallel, no other test runs beside this module's:
# 1,000 clusters come and go, loading the machine on purpose.
pytestmark = pytest.mark.alone

CONFIGMAP = mcr.Kind("v1", "ConfigMap")
NAMESPACE = mcr.Kind("v1", "Namespace")
CLUSTERS = 1000
BATCH = 100
SIZE_SLACK = 2048  # bytes: counters' digits grow (1 -> 1001), the set of series must not


class LateComponent:
    """An aware added while clusters are engaged: the manager engages it with each of them."""

    def __init__(self) -> None:
        self.engagements = 0

    async def engage(self, name: str, cluster: mcr.Cluster) -> None:
        del name, cluster
        self.engagements += 1


def _limiter_entries(limiter: Any) -> int:
    """Items a (possibly combined) rate limiter keeps a retry count for."""
    nested = getattr(limiter, "limiters", None)
    if nested is not None:
        return sum(_limiter_entries(inner) for inner in nested)
    return len(getattr(limiter, "_failures", {}))


def per_name_maps(manager: mcr.Manager, provider: mcr.StaticProvider) -> dict[str, int]:
    """The size of every map keyed (directly or indirectly) by cluster name that we know of.

    Private attributes on purpose: these are the leaks the test exists to catch.
    """
    clusters = provider.clusters
    sizes: dict[str, int] = {
        "Manager._engaged": len(manager._engaged),
        "Manager._tasks": len(manager._tasks),
        "Manager._engage_started": len(manager._engage_started),
        "ManagerMetrics._children": len(manager.metrics._children),
        "ManagerMetrics._live": len(manager.metrics._live),
        "ClusterSet._entries": len(clusters._entries),
        "ClusterSet._locks": len(clusters._locks),
        "ClusterSet._tasks (members)": len(clusters._tasks),
        "ClusterSet._tasks._loops": len(clusters._tasks._loops),
    }
    for name, controller in manager.controllers.items():
        queue = controller.queue
        sizes[f"Controller[{name}]._engaged"] = len(controller._engaged)
        sizes[f"Controller[{name}]._current"] = len(controller._current)
        sizes[f"Controller[{name}].queue._ready"] = len(queue._ready)
        sizes[f"Controller[{name}].queue._turns"] = len(queue._turns)
        sizes[f"Controller[{name}].queue._processing"] = len(queue._processing)
        sizes[f"Controller[{name}].queue._purged_processing"] = len(queue._purged_processing)
        sizes[f"Controller[{name}].queue._delayed"] = len(queue._delayed)
        sizes[f"Controller[{name}].rate limiter"] = _limiter_entries(queue._rate_limiter)
    return sizes


async def scrape(session: aiohttp.ClientSession, url: str) -> tuple[int, int, str]:
    """``/metrics`` as a Prometheus server reads it: (series, bytes, body)."""
    async with session.get(url) as response:
        assert response.status == 200
        body = await response.text()
    series = [line for line in body.splitlines() if line and not line.startswith("#")]
    return len(series), len(body.encode()), body


async def test_a_thousand_clusters_come_and_go_and_nothing_stays_behind(fleet: Fleet) -> None:
    planes = [fleet["cluster-1"], fleet["cluster-2"]]
    configs = [mcr.kubeconfig_from_dict(plane.kubeconfig()) for plane in planes]
    namespace = f"churn-{uuid.uuid4().hex[:8]}"
    for config in configs:
        async with mcr.Cluster("setup", config) as setup:
            await setup.client.create(
                {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}
            )
            await setup.client.create(
                {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "one", "namespace": namespace}}
            )

    provider = mcr.StaticProvider(probe_interval=60.0)
    manager = mcr.Manager(provider, handle_signals=False, metrics_address="127.0.0.1:0")
    reconciled: set[str] = set()

    async def reconcile(request: mcr.Request) -> None:
        reconciled.add(request.cluster)

    mcr.controller_managed_by(manager).named("churn").for_(CONFIGMAP, namespace=namespace).complete(reconcile)
    run = uuid.uuid4().hex[:6]
    counter = iter(range(CLUSTERS + BATCH))

    late = LateComponent()

    async def churn(count: int, *, while_engaged: Callable[[], None] | None = None) -> None:
        """Engage ``count`` new names, wait for each one's reconcile, remove them, wait until gone."""
        names = [f"churn-{run}-{next(counter):04d}" for _ in range(count)]
        await asyncio.gather(
            *(provider.set(name, configs[index % len(configs)]) for index, name in enumerate(names))
        )
        await wait_until(
            lambda: reconciled.issuperset(names), timeout=60, what=f"{count} new clusters each reconciled"
        )
        if while_engaged is not None:
            while_engaged()
        await asyncio.gather(*(provider.remove(name) for name in names))
        await wait_until(
            lambda: not set(names) & (set(manager.clusters()) | set(manager.controllers["churn"].engaged())),
            what=f"{count} clusters disengaged",
        )
        reconciled.difference_update(names)

    async with running(manager), aiohttp.ClientSession() as session:
        url = manager.endpoints.url("/metrics")
        await churn(2)  # warm-up: series that exist once anything ran (histogram buckets) appear now
        base_series, base_bytes, _ = await scrape(session, url)
        base_maps = per_name_maps(manager, provider)

        peak: dict[str, int] = {}

        def first_batch_engaged() -> None:
            peak.update(per_name_maps(manager, provider))
            manager.add(late)

        for batch in range(CLUSTERS // BATCH):
            await churn(BATCH, while_engaged=first_batch_engaged if batch == 0 else None)
        await wait_until(lambda: late.engagements >= BATCH, what="the late component met every cluster")

        series, size, body = await scrape(session, url)
        maps = per_name_maps(manager, provider)
        print(f"/metrics after warm-up: {base_series} series, {base_bytes} bytes; ", end="")
        print(f"after {CLUSTERS} clusters came and went: {series} series, {size} bytes")
        assert f"churn-{run}-" not in body, "a departed cluster still has a series"
        assert series <= base_series, f"{series - base_series} more series after {CLUSTERS} clusters left"
        assert size <= base_bytes + SIZE_SLACK, f"/metrics grew from {base_bytes} to {size} bytes"
        engaged = "mcruntime_cluster_engagements_total"
        assert f"{engaged} {float(CLUSTERS + 2)}" in body  # the fleet-wide counts kept counting
        grown = {name: (base_maps[name], maps[name]) for name in maps if maps[name] > base_maps[name]}
        assert grown == {}, f"per-name maps grew (before, after): {grown}"
        # The measure sees the maps: while a batch was engaged they held every one of its names.
        assert peak["ClusterSet._entries"] >= base_maps["ClusterSet._entries"] + BATCH
        assert peak["Manager._engaged"] >= base_maps["Manager._engaged"] + BATCH
