"""CPU of the write path (S7) and of watch events (S8), measured as process CPU, not wall time.

Wall-clock figures are distorted on a loaded machine; the CPU this process
spends per patch and per event is not (the API server is another process).
One testbed control plane, one namespace of ConfigMaps:

1. patches: ``client.patch`` of one key, one after another; CPU ms per patch.
2. events: a manager with one ConfigMap controller (the benchmark peer's
   read-mode reconcile: read the cache, parse a timestamp) while a writer in a
   process of its own patches the objects; CPU ms per 1,000 events.

``--profile DIR`` writes cProfile statistics of each phase there (and prints
the top entries). Run: ``hatch run test:python benchmarks/write_path.py``.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import pstats
import sys
import time
from pathlib import Path

import mcruntime as mcr
from mcruntime.testing import Fleet, wait_until

CONFIGMAP = mcr.Kind("v1", "ConfigMap")
NAMESPACE = "write-path"


async def _populate(cluster: mcr.Cluster, objects: int) -> None:
    await cluster.client.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
    semaphore = asyncio.Semaphore(32)

    async def one(index: int) -> None:
        async with semaphore:
            await cluster.client.create(
                {
                    "apiVersion": "v1",
                    "kind": "ConfigMap",
                    "metadata": {"name": f"cm-{index:04d}", "namespace": NAMESPACE},
                    "data": {"ts": str(time.time()), "payload": "x" * 200},
                }
            )

    await asyncio.gather(*(one(i) for i in range(objects)))


def _profiled(profile: Path | None, name: str) -> cProfile.Profile | None:
    if profile is None:
        return None
    profiler = cProfile.Profile(time.process_time)  # CPU, not wall time: the machine may be loaded
    profiler.enable()
    return profiler


def _report(profiler: cProfile.Profile | None, profile: Path | None, name: str) -> None:
    if profiler is None or profile is None:
        return
    profiler.disable()
    profile.mkdir(parents=True, exist_ok=True)
    path = profile / f"{name}.prof"
    profiler.dump_stats(path)
    print(f"--- {name}: top entries by own time ({path})")
    pstats.Stats(str(path)).sort_stats("tottime").print_stats(25)


async def _patches(cluster: mcr.Cluster, objects: int, count: int, profile: Path | None) -> float:
    for index in range(min(100, count)):  # warm: connections, discovery
        await cluster.client.patch(
            CONFIGMAP, f"cm-{index % objects:04d}", {"data": {"observed": "warm"}}, namespace=NAMESPACE
        )
    profiler = _profiled(profile, "patches")
    began = time.process_time()
    for index in range(count):
        await cluster.client.patch(
            CONFIGMAP, f"cm-{index % objects:04d}", {"data": {"observed": str(index)}}, namespace=NAMESPACE
        )
    spent = time.process_time() - began
    _report(profiler, profile, "patches")
    return spent / count * 1000


async def _events(kubeconfig: Path, config: mcr.ClusterConfig, count: int, profile: Path | None) -> float:
    provider = mcr.StaticProvider({"bench": config}, options=mcr.ClusterOptions(cache_namespace=NAMESPACE))
    manager = mcr.Manager(provider, handle_signals=False)
    reconciled = 0

    async def reconcile(request: mcr.Request) -> None:
        nonlocal reconciled
        cluster = await manager.get_cluster(request.cluster)
        found = await cluster.cache.get_or_none(CONFIGMAP, request.name, namespace=request.namespace)
        if found is not None:
            float(str((found.get("data") or {}).get("ts", "0")))
        reconciled += 1

    mcr.controller_managed_by(manager).named("bench").for_(CONFIGMAP, namespace=NAMESPACE).complete(reconcile)
    runner = asyncio.create_task(manager.start())
    try:
        await provider.clusters.wait_engaged("bench")
        cluster = await manager.get_cluster("bench")
        informer = cluster.cache.informer(CONFIGMAP, namespace=NAMESPACE)
        await informer.wait_for_sync()
        await wait_until(lambda: reconciled >= len(informer.store.objects), timeout=300)
        events = informer.stats.events
        profiler = _profiled(profile, "events")
        began = time.process_time()
        writer = await asyncio.create_subprocess_exec(
            sys.executable, __file__, "--writer", str(kubeconfig), "--count", str(count)
        )
        await wait_until(lambda: informer.stats.events - events >= count, timeout=600)
        spent = time.process_time() - began
        _report(profiler, profile, "events")
        await writer.wait()
    finally:
        manager.stop()
        await runner
    return spent / count * 1_000_000 / 1000


async def _write(kubeconfig: Path, count: int) -> None:
    """The writer process: ``count`` patches of ``data.ts``, 8 at a time."""
    async with mcr.Cluster("writer", mcr.load_kubeconfig(kubeconfig)) as cluster:
        listed = await cluster.client.list(CONFIGMAP, namespace=NAMESPACE)
        names = [obj["metadata"]["name"] for obj in listed.items]
        semaphore = asyncio.Semaphore(8)

        async def one(index: int) -> None:
            async with semaphore:
                name = names[index % len(names)]
                patch = {"data": {"ts": str(time.time())}}
                await cluster.client.patch(CONFIGMAP, name, patch, namespace=NAMESPACE)

        await asyncio.gather(*(one(i) for i in range(count)))


async def main(args: argparse.Namespace) -> None:
    """Both phases against one control plane; print CPU per patch and per 1,000 events."""
    with Fleet() as fleet:
        plane = fleet.add("write-path")
        config = mcr.kubeconfig_from_dict(plane.kubeconfig())
        async with mcr.Cluster("bench", config) as cluster:
            await _populate(cluster, args.objects)
            per_patch = await _patches(cluster, args.objects, args.patches, args.profile)
        print(f"patch: {per_patch:.3f} CPU ms per patch ({args.patches} patches, one after another)")
        per_event = await _events(plane.kubeconfig_path(), config, args.events, args.profile)
    print(f"events: {per_event * 1000:.1f} CPU ms per 1,000 events ({args.events} events, reconciled)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--objects", type=int, default=500)
    parser.add_argument("--patches", type=int, default=2000)
    parser.add_argument("--events", type=int, default=3000)
    parser.add_argument("--profile", type=Path)
    parser.add_argument("--writer", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--count", type=int, default=0, help=argparse.SUPPRESS)
    arguments = parser.parse_args()
    if arguments.writer is not None:
        asyncio.run(_write(arguments.writer, arguments.count))
    else:
        asyncio.run(main(arguments))
