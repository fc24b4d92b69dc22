"""Idle cost of health: CPU and probes per second of N healthy, idle clusters of one server.

Each cluster holds one informer (ConfigMaps of an empty namespace), so its
watch is open and quiet; nothing else happens. The figure is this process's
CPU (utime + stime, not wall time) and the number of ``GET /version`` probes
over a window after every cluster is healthy and synced.
Run: ``hatch run test:python benchmarks/idle_health.py --clusters 200 --window 30``.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from contextlib import AsyncExitStack

import mcruntime as mcr
from mcruntime.testing import Fleet, wait_until

CONFIGMAP = mcr.Kind("v1", "ConfigMap")


async def main(clusters: int, window: float) -> None:
    """Engage ``clusters`` clusters on one plane, let them sync, then measure a quiet window."""
    with Fleet() as fleet:
        plane = fleet.add("idle-health")
        config = mcr.kubeconfig_from_dict(plane.kubeconfig())
        probes = 0
        async with AsyncExitStack() as stack:
            engaged = []
            for index in range(clusters):
                cluster = mcr.Cluster(f"idle-{index}", config, mcr.ClusterOptions(cache_namespace="default"))
                real = cluster.transport.probe

                async def counted(timeout: float, real=real):  # type: ignore[no-untyped-def]
                    nonlocal probes
                    probes += 1
                    return await real(timeout)

                cluster.transport.probe = counted  # type: ignore[method-assign]
                engaged.append(await stack.enter_async_context(cluster))
            informers = [cluster.cache.informer(CONFIGMAP, namespace="default") for cluster in engaged]
            await wait_until(lambda: all(informer.has_synced for informer in informers), timeout=300)
            await wait_until(lambda: all(cluster.health.healthy for cluster in engaged), timeout=300)
            await asyncio.sleep(10)  # let start-up work settle before the window (not a synchronisation)
            before_probes, before_cpu = probes, time.process_time()
            await asyncio.sleep(window)  # the measured window of rest
            cpu, probed = time.process_time() - before_cpu, probes - before_probes
    print(
        f"{clusters} idle clusters: {cpu / window * 1000:.1f} CPU ms/s, "
        f"{probed / window:.2f} probes/s over {window:g}s"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clusters", type=int, default=200)
    parser.add_argument("--window", type=float, default=30.0)
    arguments = parser.parse_args()
    asyncio.run(main(arguments.clusters, arguments.window))
