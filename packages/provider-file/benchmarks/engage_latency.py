"""Engage latency of the file provider: a kubeconfig file appears -> first reconcile there.

One local control plane with one ConfigMap in a namespace of its own; a
manager runs a KubeconfigFileProvider over an empty directory (default
debounce) and a controller on ConfigMaps of that namespace. Each round writes
one new kubeconfig file (atomically, as a temporary file renamed into place)
and measures the time until the reconciler first runs for the cluster that
file describes; the file is then deleted and the cluster's disengagement
awaited, so every round starts from the same state. The figure covers the
directory event, the debounce, the pass, starting the cluster, the informer's
list and watch, and the reconcile.

Run: hatch run test:python packages/provider-file/benchmarks/engage_latency.py [--rounds 20]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
from pathlib import Path

import yaml

import mcruntime as mcr
from mcruntime.testing import ControlPlane, Fleet, wait_until
from mcruntime_file import KubeconfigFileProvider

CONFIGMAP = mcr.Kind("v1", "ConfigMap")
NAMESPACE = "engage-latency"


async def _seed(plane: ControlPlane) -> None:
    async with mcr.Cluster("seed", mcr.kubeconfig_from_dict(plane.kubeconfig())) as admin:
        await admin.client.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
        await admin.client.create(
            {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "marker", "namespace": NAMESPACE}}
        )


async def _measure(plane: ControlPlane, directory: Path, rounds: int) -> list[float]:
    provider = KubeconfigFileProvider(directory, naming="context")
    manager = mcr.Manager(provider, handle_signals=False)
    first_reconcile: dict[str, float] = {}
    reconciled = asyncio.Event()

    async def reconcile(request: mcr.Request) -> None:
        if request.cluster not in first_reconcile:
            first_reconcile[request.cluster] = time.perf_counter()
            reconciled.set()

    mcr.controller_managed_by(manager).for_(CONFIGMAP, predicates=[mcr.in_namespaces(NAMESPACE)]).complete(
        reconcile
    )
    runner = asyncio.create_task(manager.start())
    await manager.wait_started()
    latencies: list[float] = []
    try:
        for index in range(rounds):
            name = f"bench-{index}"
            document = plane.kubeconfig()
            document["contexts"][0]["name"] = document["current-context"] = name
            path, temporary = directory / f"{name}.kubeconfig", directory / f".{name}.tmp"
            temporary.write_text(yaml.safe_dump(document))
            reconciled.clear()
            started = time.perf_counter()
            os.replace(temporary, path)
            async with asyncio.timeout(30):
                while name not in first_reconcile:
                    await reconciled.wait()
                    reconciled.clear()
            latencies.append(first_reconcile[name] - started)
            path.unlink()
            await _disengaged(manager, name)
    finally:
        manager.stop()
        await runner
    return latencies


async def _disengaged(manager: mcr.Manager, name: str) -> None:
    await wait_until(lambda: name not in manager.clusters(), interval=0.01, what=f"{name} disengaged")


def main() -> None:
    """Start one control plane, measure ``--rounds`` engagements, print median and p90."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as work, Fleet(workdir=Path(work) / "testbed") as fleet:
        (plane,) = fleet.start(1)
        directory = Path(work) / "kubeconfigs"
        directory.mkdir()

        async def run() -> list[float]:
            await _seed(plane)
            return await _measure(plane, directory, args.rounds)

        latencies = sorted(asyncio.run(run()))
    ms = [value * 1000 for value in latencies]
    p90 = ms[max(0, round(0.9 * len(ms)) - 1)]
    print(f"engage latency, file appears -> first reconcile, {len(ms)} rounds (default options):")
    median = statistics.median(ms)
    print(f"  median {median:.0f} ms, p90 {p90:.0f} ms, min {ms[0]:.0f} ms, max {ms[-1]:.0f} ms")


if __name__ == "__main__":
    main()
