"""The memory of 10,000 Secrets cached whole against metadata-only.

One testbed API server holds 10,000 Secrets of 4 KiB of data each (one
namespace). Each measurement runs in a fresh Python process, so neither
allocator reuse nor an earlier store skews it: the process opens the cluster,
resolves the kind (discovery), collects garbage and reads its RSS, then fills
one informer (the cache's default view of Secrets, whole or
``metadata_only=True``), collects again and reads RSS once more. The figure is
the growth, per object and in all. Both views drop ``managedFields`` (the
default transform). The kubeconfig reaches the child on stdin, never a file.

Run: hatch run test:python benchmarks/cache_metadata.py (about 10 minutes on
2 cores; ``BENCH_SECRETS=200`` checks the script in one).
"""

from __future__ import annotations

import asyncio
import base64
import gc
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import mcruntime as mcr
from mcruntime.testing import Fleet

SECRET = mcr.Kind("v1", "Secret")
OBJECTS = int(os.environ.get("BENCH_SECRETS", "10000"))  # smaller for a quick check of the script
DATA_BYTES = 4096
NAMESPACE = "bench"
RUNS = 3


def _rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


async def _populate(cluster: mcr.Cluster) -> None:
    await cluster.client.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
    semaphore = asyncio.Semaphore(32)

    async def one(index: int) -> None:
        payload = base64.b64encode(os.urandom(DATA_BYTES)).decode()  # 4 KiB of data per Secret
        async with semaphore:
            await cluster.client.create(
                {
                    "apiVersion": "v1",
                    "kind": "Secret",
                    "metadata": {
                        "name": f"secret-{index:05d}",
                        "namespace": NAMESPACE,
                        "labels": {"app": "bench", "shard": str(index % 16)},
                    },
                    "type": "Opaque",
                    "data": {"payload": payload},
                }
            )

    await asyncio.gather(*(one(i) for i in range(OBJECTS)))


async def _measure(kubeconfig: dict[str, object], metadata_only: bool) -> dict[str, float]:
    config = mcr.kubeconfig_from_dict(kubeconfig)
    async with mcr.Cluster("bench", config) as cluster:
        await cluster.client.resource(SECRET)
        async for _page in cluster.client.list_pages(SECRET, namespace=NAMESPACE, page_size=1):
            break  # one small request opens the connection; the rest of the list is not fetched
        gc.collect()
        before = _rss_mib()
        started = time.perf_counter()
        informer = cluster.cache.informer(SECRET, namespace=NAMESPACE, metadata_only=metadata_only)
        await informer.wait_for_sync()
        seconds = time.perf_counter() - started
        count = len(informer.store.objects)
        gc.collect()
        after = _rss_mib()
    return {"objects": count, "rss_before_mib": before, "rss_after_mib": after, "sync_seconds": seconds}


def _child(metadata_only: bool, kubeconfig: dict[str, object]) -> dict[str, float]:
    mode = "metadata" if metadata_only else "whole"
    done = subprocess.run(
        [sys.executable, __file__, "--child", mode],
        input=json.dumps(kubeconfig).encode(),
        capture_output=True,
        check=True,
    )
    result: dict[str, float] = json.loads(done.stdout.decode().strip().splitlines()[-1])
    return result


def main() -> None:
    """Populate a testbed, then measure each view in fresh processes and print the figures."""
    with Fleet() as fleet:
        plane = fleet.add("bench")
        kubeconfig = plane.kubeconfig()
        started = time.perf_counter()

        async def setup() -> None:
            async with mcr.Cluster("setup", mcr.kubeconfig_from_dict(kubeconfig)) as cluster:
                await _populate(cluster)

        asyncio.run(setup())
        print(f"created {OBJECTS:,} Secrets of {DATA_BYTES} bytes in {time.perf_counter() - started:.0f}s")
        results: dict[str, list[dict[str, float]]] = {"whole": [], "metadata": []}
        for _ in range(RUNS):
            for mode in ("whole", "metadata"):
                results[mode].append(_child(mode == "metadata", kubeconfig))
        for mode, runs in results.items():
            growth = sorted(run["rss_after_mib"] - run["rss_before_mib"] for run in runs)
            median = growth[len(growth) // 2]
            total = sorted(run["rss_after_mib"] for run in runs)[len(runs) // 2]
            sync = sorted(run["sync_seconds"] for run in runs)[len(runs) // 2]
            each = ", ".join(f"{g:.1f}" for g in growth)
            print(
                f"{mode:9s} objects {int(runs[0]['objects']):,}  RSS growth median {median:6.1f} MiB "
                f"({median * 1024 / OBJECTS:.2f} KiB per Secret; runs {each})  "
                f"process RSS median {total:.1f} MiB  sync {sync:.2f}s"
            )
        print(json.dumps(results))


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        measured = asyncio.run(_measure(json.loads(sys.stdin.read()), sys.argv[2] == "metadata"))
        print(json.dumps(measured))
    else:
        main()
