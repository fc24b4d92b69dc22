"""Core I figures: informer initial-list throughput and the memory of an engaged cluster.

1. 10,000 ConfigMaps in one namespace. The floor is the same paged list
   (500 per page) fetched with plain aiohttp and decoded with the stdlib json
   module, no runtime at all; mcruntime's figure is an Informer from start to
   synced (store filled, handlers told).
2. RSS per cluster: N Cluster objects against the same API server, each with
   one informer (ConfigMaps of an empty namespace) synced and idle; the RSS
   growth divided by N.
3. RSS per cached object: the growth while one informer holds the 10,000
   ConfigMaps (about 300 bytes of JSON each).
Run: hatch run test:python benchmarks/core_informer.py
"""

from __future__ import annotations

import asyncio
import gc
import json
import statistics
import time
from pathlib import Path

import aiohttp

import mcruntime as mcr
from mcruntime.testing import ControlPlane, Fleet

CONFIGMAP = mcr.Kind("v1", "ConfigMap")
OBJECTS = 10_000


def _rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


async def _populate(cluster: mcr.Cluster, namespace: str) -> None:
    await cluster.client.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
    semaphore = asyncio.Semaphore(64)

    async def one(index: int) -> None:
        async with semaphore:
            await cluster.client.create(
                {
                    "apiVersion": "v1",
                    "kind": "ConfigMap",
                    "metadata": {"name": f"cm-{index:05d}", "namespace": namespace},
                    "data": {"index": str(index), "payload": "x" * 200},
                }
            )

    await asyncio.gather(*(one(i) for i in range(OBJECTS)))


async def _raw_list(plane: ControlPlane, namespace: str) -> float:
    context = plane.admin_ssl_context()
    started = time.perf_counter()
    count = 0
    async with aiohttp.ClientSession() as session:
        params = {"limit": "500"}
        while True:
            async with session.get(
                f"{plane.server}/api/v1/namespaces/{namespace}/configmaps", params=params, ssl=context
            ) as response:
                page = json.loads(await response.read())
            count += len(page["items"])
            token = page["metadata"].get("continue")
            if not token:
                break
            params["continue"] = token
    assert count == OBJECTS
    return time.perf_counter() - started


async def _informer_sync(plane: ControlPlane, namespace: str) -> float:
    config = mcr.kubeconfig_from_dict(plane.kubeconfig())
    async with mcr.Cluster("bench", config) as cluster:
        await cluster.client.resource(CONFIGMAP)  # discovery outside the timing
        seen = 0

        def count(_obj: dict[str, object], _initial: bool) -> None:
            nonlocal seen
            seen += 1

        started = time.perf_counter()
        informer = cluster.cache.informer(CONFIGMAP, namespace=namespace)
        informer.add_handler(mcr.ResourceEventHandler(on_add=count))
        await informer.wait_for_sync()
        elapsed = time.perf_counter() - started
        assert seen == OBJECTS
    return elapsed


async def _rss_per_cluster(plane: ControlPlane, clusters: int) -> float:
    config = mcr.kubeconfig_from_dict(plane.kubeconfig())
    warm = mcr.Cluster("warm", config)  # import and first-use costs outside the figure
    await warm.start()
    await warm.cache.informer(CONFIGMAP, namespace="empty").wait_for_sync()
    gc.collect()
    before = _rss_mib()
    engaged = []
    for index in range(clusters):
        cluster = mcr.Cluster(f"c{index}", config)
        await cluster.start()
        await cluster.cache.informer(CONFIGMAP, namespace="empty").wait_for_sync()
        engaged.append(cluster)
    gc.collect()
    after = _rss_mib()
    for cluster in [warm, *engaged]:
        await cluster.stop()
    return (after - before) / clusters


async def main() -> None:
    """Run every measurement once and print the figures."""
    with Fleet() as fleet:
        plane = fleet.add("bench")
        config = mcr.kubeconfig_from_dict(plane.kubeconfig())
        async with mcr.Cluster("setup", config) as cluster:
            await _populate(cluster, "bench")
        raw = [await _raw_list(plane, "bench") for _ in range(5)]
        informed = [await _informer_sync(plane, "bench") for _ in range(5)]
        raw_median, informer_median = statistics.median(raw), statistics.median(informed)
        for label, seconds in (
            ("raw paged list + json.loads", raw_median),
            ("informer start -> synced", informer_median),
        ):
            print(f"{label:28s} median {seconds:.3f}s = {OBJECTS / seconds:,.0f} objects/s")
        print(f"informer / raw time ratio:   {informer_median / raw_median:.2f}")
        per_cluster = await _rss_per_cluster(plane, 50)
        print(f"RSS per engaged cluster with one idle informer: {per_cluster:.2f} MiB (over 50 clusters)")
        async with mcr.Cluster("objects", config) as cluster:
            await cluster.client.resource(CONFIGMAP)
            gc.collect()
            before = _rss_mib()
            await cluster.cache.informer(CONFIGMAP, namespace="bench").wait_for_sync()
            gc.collect()
            per_object = (_rss_mib() - before) * 1024 / OBJECTS
        print(f"RSS per cached ConfigMap: {per_object:.2f} KiB")


if __name__ == "__main__":
    asyncio.run(main())
