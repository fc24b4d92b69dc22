"""mcruntime's side of the benchmarks: a manager, the file provider, one ConfigMap controller.

It runs as a process of its own, like the Go and kopf peers, so that RSS, file
descriptors and start-up are measured the same way for everyone. The reconcile
is the shared work: note the start time, read the object from the cluster's
cache, parse the writer's timestamp, report one record.

Run by benchmarks/run.py; ``--profile FILE`` writes cProfile statistics.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import logging
import time
from pathlib import Path

from peerio import PeerIO, start_record, written_at

import mcruntime as mcr
from mcruntime_file import KubeconfigFileProvider

CONFIGMAP = mcr.Kind("v1", "ConfigMap")


async def serve(
    directory: Path,
    namespace: str,
    workers: int | None,
    debounce: float | None,
    mode: str,
    run_id: str,
    gc_freeze: bool = True,
) -> None:
    """Run the manager until stdin closes.

    The cache holds the benchmark's namespace only, as the Go peer's
    (controller-runtime's ``DefaultNamespaces``) does.
    """
    options = mcr.ClusterOptions(cache_namespace=namespace)
    if debounce is None:
        provider = KubeconfigFileProvider(directory, naming="context", options=options)
    else:
        provider = KubeconfigFileProvider(directory, naming="context", options=options, debounce=debounce)
    manager = mcr.Manager(provider, handle_signals=False, gc_freeze=gc_freeze)
    io = PeerIO(lambda: len(manager.clusters()))
    io.emit(start_record())

    async def reconcile(request: mcr.Request) -> None:
        begun = time.time()
        cluster = await manager.get_cluster(request.cluster)
        found: dict[str, object] | None
        if mode == "live":  # the hung-cluster scenario: a read that reaches the API server
            try:
                found = await cluster.client.get(CONFIGMAP, request.name, namespace=request.namespace)
            except mcr.NotFound:
                return
        else:
            found = await cluster.cache.get_or_none(CONFIGMAP, request.name, namespace=request.namespace)
        if found is None:
            return
        record: dict[str, object] = {"ev": "r", "c": request.cluster, "n": request.name, "t": begun}
        data = found.get("data")
        written = written_at(data)
        if written is not None:
            record["w"] = written
        if mode == "write":
            marker = f"{run_id}:{data.get('ts') if isinstance(data, dict) else None}"
            if isinstance(data, dict) and data.get("observed") == marker:
                return  # our own write coming back: nothing to do, no record
            await cluster.client.patch(
                CONFIGMAP, request.name, {"data": {"observed": marker}}, namespace=request.namespace
            )
            record["p"] = 1
        io.emit(record)

    builder = mcr.controller_managed_by(manager).named("bench").for_(CONFIGMAP, namespace=namespace)
    if workers is not None:  # otherwise the controller's defaults, whatever they are in this version
        builder = builder.with_options(max_concurrent_reconciles=workers)
    builder.complete(reconcile)
    runner = asyncio.create_task(manager.start())
    try:
        await io.run()
    finally:
        manager.stop()
        await runner


def main() -> None:
    """Parse the shared peer options and serve."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kubeconfig-dir", type=Path, required=True)
    parser.add_argument("--namespace", required=True)
    parser.add_argument(
        "--workers", type=int, default=None, help="max_concurrent_reconciles (default: the controller's own)"
    )
    parser.add_argument("--run-id", default="0", help="write mode: marks this run's patches")
    parser.add_argument("--debounce", type=float, default=None, help="the file provider's (default: its own)")
    parser.add_argument(
        "--mode",
        choices=("read", "write", "live"),
        default="read",
        help="read: from the cache; write: patch data.observed once per write; live: GET from the server",
    )
    parser.add_argument("--profile", type=Path, help="write cProfile statistics here")
    parser.add_argument(
        "--no-gc-freeze", action="store_true", help="Manager(gc_freeze=False): the collector sees the cache"
    )
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    arguments = (
        args.kubeconfig_dir,
        args.namespace,
        args.workers,
        args.debounce,
        args.mode,
        args.run_id,
        not args.no_gc_freeze,
    )
    if args.profile is None:
        asyncio.run(serve(*arguments))
        return
    profiler = cProfile.Profile()
    profiler.enable()
    try:
        asyncio.run(serve(*arguments))
    finally:
        profiler.disable()
        profiler.dump_stats(args.profile)


if __name__ == "__main__":
    main()
