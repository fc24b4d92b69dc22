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
from collections.abc import Callable
from pathlib import Path

from peerio import PeerIO, start_record, written_at

import mcruntime as mcr
from mcruntime_file import KubeconfigFileProvider

CONFIGMAP = mcr.Kind("v1", "ConfigMap")


class HealthTally(logging.Handler):
    """Counts the health verdicts the clusters log (``mcruntime.health``), for the fleet scenarios.

    Every change of a cluster's health state is one log line, so counting them
    misses none, however brief, and needs no hook in the core. A cluster whose
    *first* verdict is unhealthy was judged sick before it had a chance: in the
    benchmark every cluster is healthy, so each one is a false alarm.
    Records at WARNING or above still reach the root logger's handlers.
    """

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.first: dict[str, str] = {}  # cluster -> its first verdict
        self.unhealthy = 0  # transitions to unhealthy, first or not
        self.reasons: dict[str, int] = {}

    def emit(self, record: logging.LogRecord) -> None:
        if record.msg == "cluster %r is %s%s" and isinstance(record.args, tuple) and len(record.args) == 3:
            cluster, state, reason = record.args
            self.first.setdefault(str(cluster), str(state))
            if state == "unhealthy":
                self.unhealthy += 1
                key = str(reason).removeprefix(": ")[:120]
                self.reasons[key] = self.reasons.get(key, 0) + 1
        if record.levelno >= logging.WARNING:
            logging.getLogger().handle(record)

    def figures(self) -> dict[str, object]:
        """The tally for a ``stats`` answer."""
        firsts = list(self.first.values())
        return {
            "health_first_unhealthy": firsts.count("unhealthy"),
            "health_first_healthy": firsts.count("healthy"),
            "health_unhealthy_transitions": self.unhealthy,
            "health_reasons": dict(sorted(self.reasons.items(), key=lambda item: -item[1])[:5]),
        }


def tally_health() -> HealthTally:
    """Install a :class:`HealthTally` on mcruntime's health logger and return it."""
    tally = HealthTally()
    logger = logging.getLogger("mcruntime.health")
    logger.addHandler(tally)
    logger.setLevel(logging.INFO)
    logger.propagate = False  # INFO lines stay out of stderr; the tally forwards warnings
    return tally


async def serve(
    directory: Path,
    namespace: str,
    workers: int | None,
    debounce: float | None,
    mode: str,
    run_id: str,
    gc_freeze: bool = True,
    keys_per_turn: int | None = None,
    profiled: dict[str, Callable[[], None]] | None = None,
) -> None:
    """Run the manager until stdin closes.

    ``profiled`` (with ``--profile``): the stdin commands that write the statistics so far
    (``profile``) and that split them (``profile_split``: what came before, the engage, to a
    file of its own, so that the next ``profile`` shows the idle window alone).

    The cache holds the benchmark's namespace only, as the Go peer's
    (controller-runtime's ``DefaultNamespaces``) does.
    """
    options = mcr.ClusterOptions(cache_namespace=namespace)
    if debounce is None:
        provider = KubeconfigFileProvider(directory, naming="context", options=options)
    else:
        provider = KubeconfigFileProvider(directory, naming="context", options=options, debounce=debounce)
    manager = mcr.Manager(provider, handle_signals=False, gc_freeze=gc_freeze)
    tally = tally_health()
    commands = profiled

    def figures() -> dict[str, object]:  # health, and what the heap's thaws after stops cost
        freezer = manager.freezer
        return {**tally.figures(), "thaws": freezer.thaws, "longest_thaw_s": freezer.longest_thaw}

    io = PeerIO(lambda: len(manager.clusters()), figures, commands)
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
        # Go's MaxConcurrentReconciles: that many reconciles at once over all clusters, any
        # of which may be one cluster's. Here: the total bound, and a lane as wide as it.
        builder = builder.with_options(max_concurrent_reconciles=workers, max_total_reconciles=workers)
    if keys_per_turn is not None:  # S7: Go's single FIFO hands out a cluster's whole backlog in a row
        builder = builder.with_options(keys_per_turn=keys_per_turn)
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
        "--workers", type=int, default=None, help="reconciles at once over all clusters, as Go's MaxConcurrentReconciles (default: the controller's own)"
    )
    parser.add_argument("--run-id", default="0", help="write mode: marks this run's patches")
    parser.add_argument("--debounce", type=float, default=None, help="the file provider's (default: its own)")
    parser.add_argument(
        "--mode",
        choices=("read", "write", "live"),
        default="read",
        help="read: from the cache; write: patch data.observed once per write; live: GET from the server",
    )
    parser.add_argument(
        "--keys-per-turn", type=int, default=None, help="requests a cluster is handed in a row (default: the controller's own)"
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
        args.keys_per_turn,
    )
    if args.profile is None:
        asyncio.run(serve(*arguments))
        return
    profiler = cProfile.Profile()
    path: Path = args.profile
    dumped = False

    def split() -> None:  # what came so far (the engage) to <stem>_engage.prof; start afresh
        profiler.disable()
        profiler.dump_stats(path.with_name(f"{path.stem}_engage{path.suffix}"))
        profiler.clear()
        profiler.enable()

    def dump() -> None:  # the statistics up to now, and no more: the shutdown is not measured
        nonlocal dumped
        profiler.disable()
        profiler.dump_stats(path)
        dumped = True

    profiler.enable()
    try:
        asyncio.run(serve(*arguments, profiled={"profile": dump, "profile_split": split}))
    finally:
        profiler.disable()
        if not dumped:
            profiler.dump_stats(path)


if __name__ == "__main__":
    main()
