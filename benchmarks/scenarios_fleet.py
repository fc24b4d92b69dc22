"""Scenarios S7-S12: writes, CPU per event, 1,000 clusters, the GC, a hung cluster, 10,000 clusters.

Like ``scenarios.py``, each runs its peers one at a time, in an order drawn
from the bench's seeded generator, and returns plain JSON-able data with
``runs`` per peer (every figure of every run) and ``stats`` (min / median /
max), which ``report.py`` turns into tables, ratios and goals.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness import BenchError, Peer, percentile, running, write_kubeconfig, write_load
from scenarios import (
    BULK,
    SMALL,
    Bench,
    _all_reconciled,
    _completed_at,
    _matched,
    _profile_summary,
    _reconciled,
    _TolerateTimeout,
    spread,
    write_run,
)
from sizes import FULL, Sizes

from mcruntime._control.controller import DEFAULT_KEYS_PER_TURN
from mcruntime._manager.gcfreeze import THAW_SHARE
from mcruntime.testing import ControlPlane

WRITES = "writes"  # namespace of the S7 objects
FLEET = "fleet"  # namespace of the S9 objects
GC = "gc"  # namespace of the S10 objects


def _at_least(peer: Peer, total: int) -> Callable[[], bool]:
    """A wait condition: ``total`` distinct objects reconciled."""
    return lambda: _reconciled(peer) >= total


def _summary(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    return {
        kind: {"runs": done, "stats": spread([_numbers(run) for run in done])}
        for kind, done in runs.items()
        if done
    }


def _numbers(run: dict[str, Any]) -> dict[str, float]:
    return {key: value for key, value in run.items() if isinstance(value, (int, float))}


# --- S7 writes ------------------------------------------------------------------------------


# Our peer in the controller's default order (see _s7_order).
S7_DEFAULT_TURNS = f"mcruntime, turns of {DEFAULT_KEYS_PER_TURN}"


def _s7_order(bench: Bench, kind: str) -> list[str]:
    """Our peer's turns in S7: Go's order, or the controller's default for ``S7_DEFAULT_TURNS``.

    multicluster-runtime's queue is one FIFO over all clusters. A cluster's
    listed objects arrive together, so Go patches one cluster's whole backlog,
    then the next's. Our controller by default hands each cluster 32 requests
    in a row, then the next cluster: fairer to a cluster behind a busy one. On
    this testbed (ten API servers sharing two cores) the order can move the
    servers' CPU per patch (session 32: about 5 % on medians, from -7 % to
    +24 % between runs). The goal compares the runtimes on the same writes in
    the same order, so our peer takes turns as long as a cluster's backlog; the
    default's figure is reported beside it.
    """
    if kind == "mcruntime":
        return ["--keys-per-turn", str(bench.sizes.writes_objects)]
    if kind == S7_DEFAULT_TURNS:
        return ["--keys-per-turn", str(DEFAULT_KEYS_PER_TURN)]
    return []


async def _s7_run(bench: Bench, kind: str, label: str, extra: Sequence[str] = ()) -> dict[str, Any]:
    sizes = bench.sizes
    total = len(bench.planes) * sizes.writes_objects
    directory = bench.directory(label)
    for plane in bench.planes:
        write_kubeconfig(directory / f"{plane.name}.kubeconfig", [(f"s7-{plane.name}", plane)])
    workers = str(sizes.writes_workers)
    argv = ["--mode", "write", "--workers", workers, "--run-id", label, *_s7_order(bench, kind), *extra]
    peer_kind = "mcruntime" if kind == S7_DEFAULT_TURNS else kind
    async with running(bench.peer(peer_kind, directory, WRITES, argv)) as peer:
        await peer.wait_until(_at_least(peer, total), sizes.timeout, f"{total} patching reconciles")
        end = _completed_at(peer)
        first = min(at for _, _, at, _ in peer.records)
        cpu = peer.cpu_seconds()
        sample = await peer.sample()
    return {
        "spawn_to_all": end - peer.spawned,
        "per_second": total / (end - peer.spawned),
        "per_second_after_first": total / (end - first) if end > first else float("nan"),
        "cpu_s": cpu,
        "cpu_ms_per_reconcile": cpu * 1000 / total,
        "rss": sample["rss"],
        "heap": sample["heap"],
    }


async def profile(bench: Bench, scenario: str, path: Path) -> dict[str, Any] | None:
    """One extra mcruntime run of ``scenario`` under cProfile; its summary, or None if not profiled."""
    sizes = bench.sizes
    extra = ["--profile", str(path)]
    if scenario == "s1":
        return None  # S1 profiles itself in full runs
    if scenario == "s2":
        rate, seconds = sizes.s2_rate, sizes.s2_seconds
        await write_run(bench, "mcruntime", BULK, sizes.bulk_objects, rate, seconds, "s2p", extra)
    elif scenario in ("s9", "s12") and f"{scenario}_documents" in bench.notes:
        documents = bench.notes[f"{scenario}_documents"]
        await _fleet_run(bench, "mcruntime", documents, f"{scenario}p", extra, limit=sizes.timeout)
    elif scenario == "s7":
        await _s7_run(bench, "mcruntime", "s7-profile", extra)
    elif scenario == "s8":
        rate, seconds = sizes.cpu_rate, sizes.cpu_seconds
        await write_run(bench, "mcruntime", BULK, sizes.bulk_objects, rate, seconds, "s8p", extra)
    elif scenario == "s10":
        rate, seconds = sizes.gc_rate, sizes.gc_seconds
        await write_run(bench, "mcruntime", GC, sizes.gc_objects, rate, seconds, "s10p", extra)
    else:
        return None
    engage = path.with_name(f"{path.stem}_engage{path.suffix}")
    if engage.exists():  # S9, S12: the idle window and the engage, each on its own
        return {"top": _profile_summary(path), "window": "idle", "engage": _profile_summary(engage)}
    return {"top": _profile_summary(path)}


async def s7_writes(bench: Bench) -> dict[str, Any]:
    """Every object of every plane reconciled once by a reconcile that patches it; 4 workers."""
    sizes = bench.sizes
    total = len(bench.planes) * sizes.writes_objects
    runs: dict[str, list[dict[str, Any]]] = {kind: [] for kind in _s7_kinds(bench)}
    for repeat in range(sizes.writes_repeats):
        for kind in _s7_kinds(bench):
            label = f"s7-{kind.replace(' ', '-').replace(',', '')}-{repeat}"
            runs[kind].append(await _s7_run(bench, kind, label))
            data = runs[kind][-1]
            bench.log(f"S7 {kind}: {data['per_second']:.0f} patches/s, {data['cpu_s']:.1f} CPU s")
    return {"objects": total, "workers": sizes.writes_workers, "peers": _summary(runs)}


def _s7_kinds(bench: Bench) -> list[str]:
    """S7's peers in a random order: the multi-cluster ones and our peer in its default order."""
    kinds = bench.multicluster(on_json=True)
    if "mcruntime" in kinds:
        kinds.insert(bench.rng.randrange(len(kinds) + 1), S7_DEFAULT_TURNS)
    return kinds


# --- S8 CPU per event -----------------------------------------------------------------------


async def s8_steady_cpu(bench: Bench) -> dict[str, Any]:
    """CPU seconds per 1,000 watch events at a fixed event rate, after the initial sync."""
    sizes = bench.sizes
    kinds = bench.multicluster(shipped=False, on_json=True)
    runs: dict[str, list[dict[str, Any]]] = {kind: [] for kind in kinds}
    for repeat in range(sizes.cpu_repeats):  # the order is drawn anew each round
        for kind in bench.multicluster(shipped=False, on_json=True):
            label = f"s8-{kind.replace(' ', '-')}-{repeat}"
            rate, seconds = sizes.cpu_rate, sizes.cpu_seconds
            data = await write_run(bench, kind, BULK, sizes.bulk_objects, rate, seconds, label)
            data.pop("latencies_ms")
            runs[kind].append(data)
            bench.log(
                f"S8 {kind} run {repeat + 1}: {data['cpu_ms_per_1000']:.0f} CPU ms per 1,000 events "
                f"({data['matched']}/{data['writes']} at {data['achieved_rate']:.0f}/s)"
            )
    return {
        "rate": sizes.cpu_rate,
        "seconds": sizes.cpu_seconds,
        "repeats": sizes.cpu_repeats,
        "peers": _summary(runs),
    }


# --- S9 1,000 clusters and S12 10,000 clusters ---------------------------------------------


@dataclass(frozen=True)
class LargeFleetSizes:
    """S12's sizes (kept here, not in ``Sizes``, so other scenarios' sizes are untouched).

    S12 is S9 at the size one replica is meant to carry: the same objects per
    cluster and the same idle window (``Sizes.fleet_objects``,
    ``fleet_idle_seconds``), ten times the clusters. The Go peer is given
    ``go_seconds`` to engage them and is then measured where it got.
    """

    clusters: int
    go_seconds: float


FULL_LARGE_FLEET = LargeFleetSizes(clusters=10_000, go_seconds=300.0)
SMOKE_LARGE_FLEET = LargeFleetSizes(clusters=30, go_seconds=60.0)


def large_fleet_sizes(sizes: Sizes) -> LargeFleetSizes:
    """S12's sizes for a run of ``sizes``."""
    return FULL_LARGE_FLEET if sizes == FULL else SMOKE_LARGE_FLEET


async def _token_users(
    planes: Sequence[ControlPlane], count: int, prefix: str = "fleet"
) -> list[tuple[str, dict[str, Any]]]:
    """``count`` kubeconfig documents, each for a token user of its own, spread over ``planes``."""
    limit = asyncio.Semaphore(8)
    digits = max(4, len(str(count - 1)))

    async def one(index: int) -> tuple[str, dict[str, Any]]:
        plane = planes[index % len(planes)]
        context = f"{prefix}-{index:0{digits}d}"
        async with limit:
            user = await asyncio.to_thread(plane.add_token_user, f"bench-{context}")
        document = plane.kubeconfig(user)
        document["contexts"][0]["name"] = context
        document["current-context"] = context
        return context, document

    return list(await asyncio.gather(*(one(index) for index in range(count))))


def _clusters_done(peer: Peer, objects: int) -> int:
    """How many clusters have ``objects`` objects reconciled."""
    return sum(1 for names in peer.seen.values() if len(names) >= objects)


async def _fleet_run(
    bench: Bench,
    kind: str,
    documents: list[tuple[str, dict[str, Any]]],
    label: str,
    extra: Sequence[str] = (),
    limit: float | None = None,
) -> dict[str, Any]:
    """One peer over every document's file from the start; its figures.

    ``limit``: seconds the peer may take to engage all; past it the peer is
    measured where it got (``done`` clusters, no idle figure: it is not idle)
    instead of failing the scenario.
    """
    sizes = bench.sizes
    directory = bench.directory(label)
    for context, document in documents:
        write_kubeconfig(directory / f"{context}.kubeconfig", [], document)
    names = [context for context, _ in documents]
    objects = sizes.fleet_objects
    async with running(bench.peer(kind, directory, FLEET, extra)) as peer:

        def all_done() -> bool:  # cheap first test: it runs after every batch of records
            return len(peer.seen) >= len(names) and _all_reconciled(peer, names, objects)()

        finished = True
        try:
            wait = sizes.timeout if limit is None else limit
            await peer.wait_until(all_done, wait, f"{len(names)} clusters")
        except BenchError as error:
            if limit is None or "timed out" not in str(error):
                raise
            finished = False
        elapsed = time.time() - peer.spawned
        done = _clusters_done(peer, objects)
        engage = _completed_at(peer) - peer.spawned if finished else float("nan")
        idle = float("nan")
        idle_split: dict[str, float] = {}
        if finished:
            await asyncio.sleep(2.0)
            collected = (await peer.command("stats")).get("gc_s")
            if collected is not None:  # Python peers: the cyclic collector's share of the engage
                bench.log(f"{label}: {float(collected):.1f} s in the garbage collector by the engage's end")
            if "--profile" in extra:
                await peer.command("profile_split")  # the engage to a file of its own
            idle_before, split_before = peer.cpu_seconds(), peer.cpu_split()
            await asyncio.sleep(sizes.fleet_idle_seconds)
            idle = peer.cpu_seconds() - idle_before
            split_after = peer.cpu_split()
            idle_split = {key: split_after[key] - split_before[key] for key in split_after}
            bench.log(
                f"{label}: idle CPU {idle:.2f} s in {sizes.fleet_idle_seconds:g} s: user "
                f"{idle_split['user']:.2f}, system {idle_split['system']:.2f}, main thread "
                f"{idle_split['main_thread']:.2f}"
            )
        if "--profile" in extra:
            await peer.command("profile")  # the idle window (or, unfinished, all so far), not the shutdown
        sample = await peer.sample()
        stats = await peer.command("stats")
        thaw = await _thaw_at_size(bench, peer, directory, names, stats) if finished else {}
    return {
        **thaw,
        "engage": engage,
        "elapsed": elapsed,
        "done": done,
        "started": len(peer.seen),
        "idle": idle,
        "idle_split": idle_split,
        "sample": sample,
        "health": {key: value for key, value in stats.items() if key.startswith("health_")},
    }


async def _thaw_at_size(
    bench: Bench, peer: Peer, directory: Path, names: list[str], stats: dict[str, Any]
) -> dict[str, Any]:
    """After the idle window, a tenth of the fleet stops (its files removed): what the thaw costs.

    A frozen heap keeps a stopped cluster's reference cycles until mcruntime
    thaws it, collects everything and freezes again, once ``1 / THAW_SHARE``
    of the fleet has stopped: one walk of the whole heap, on the event loop.
    Peers without a freezer (no ``thaws`` in their stats) are not asked.
    """
    if "thaws" not in stats:
        return {}
    gone = names[-max(1, len(names) // THAW_SHARE) :]
    for name in gone:
        (directory / f"{name}.kubeconfig").unlink()
    left = len(names) - len(gone)
    deadline = time.monotonic() + bench.sizes.timeout
    while True:
        now = await peer.command("stats")
        if now["thaws"] > stats["thaws"] and now["clusters"] <= left:
            break
        if time.monotonic() > deadline:
            waited = bench.sizes.timeout
            raise BenchError(f"{peer.name}: no thaw {waited:.0f}s after {len(gone)} clusters stopped")
        await asyncio.sleep(0.5)  # the polling cadence of a condition the peer reports only when asked
    bench.log(
        f"{peer.name}: {len(gone)} clusters stopped; the thaw took {now['longest_thaw_s']:.2f} s "
        f"(longest so far), {now['thaws']} thaws"
    )
    return {"thaw_s": float(now["longest_thaw_s"])}


async def _fleet(bench: Bench, key: str, count: int, go_seconds: float | None) -> dict[str, Any]:
    """S9 and S12: ``count`` kubeconfig files over every plane; engage, memory, fds, idle CPU, health.

    Each peer first runs over an empty directory for its baseline, then over
    all N files present at start (so no peer rescans N times); RSS per cluster
    is the difference over N (over the clusters it engaged, when a peer ran
    out of time). With ``go_seconds`` (S12) no peer fails the scenario by being
    slow: the Go peer is measured where it got after ``go_seconds``, mcruntime
    after ``Sizes.timeout``; without (S9) a peer that times out fails it.
    """
    sizes = bench.sizes
    started = time.monotonic()
    documents = await _token_users(bench.planes, count, key)
    bench.notes[f"{key}_documents"] = documents
    bench.log(f"{key.upper()}: {count} token users in {time.monotonic() - started:.0f}s")
    runs: dict[str, list[dict[str, Any]]] = {}
    extras: dict[str, dict[str, Any]] = {}
    for kind in bench.multicluster(shipped=False):
        empty = bench.directory(f"{key}-{kind}-empty")
        async with running(bench.peer(kind, empty, FLEET)) as peer:
            await peer.wait_until(lambda: peer.started is not None, sizes.timeout, "start")
            await asyncio.sleep(1.0)
            base = await peer.sample()
        limit = None if go_seconds is None else go_seconds if kind.startswith("go") else sizes.timeout
        run = await _fleet_run(bench, kind, documents, f"{key}-{kind}", limit=limit)
        sample = run["sample"]
        engaged = count if run["done"] == count else max(sample["clusters"], 1.0)
        figures: dict[str, Any] = {
            "engage_all_s": run["engage"],
            "clusters_done": run["done"],
            "clusters_started": run["started"],
            "clusters_engaged": sample["clusters"],
            "elapsed_s": run["elapsed"],
            "rss_base": base["rss"],
            "rss": sample["rss"],
            "rss_per_cluster_mib": (sample["rss"] - base["rss"]) / engaged,
            "heap_per_cluster_mib": (sample["heap"] - base["heap"]) / engaged,
            "anon_per_cluster_mib": (sample["rss_anon"] - base["rss_anon"]) / engaged,
            "fds": sample["fds"],
            "idle_cpu_ms_per_s": run["idle"] * 1000 / sizes.fleet_idle_seconds,
            "idle_cpu_us_per_s_per_cluster": run["idle"] * 1e6 / sizes.fleet_idle_seconds / count,
            "cpu_s": sample["cpu_s"],
        }
        if "thaw_s" in run:
            figures["thaw_s"] = run["thaw_s"]
        health = run["health"]
        if health:
            figures["first_probe_failures"] = health["health_first_unhealthy"]
            figures["first_probe_passes"] = health["health_first_healthy"]
            figures["unhealthy_transitions"] = health["health_unhealthy_transitions"]
            extras[kind] = {"unhealthy_reasons": health["health_reasons"]}
        runs[kind] = [figures]
        bench.log(
            f"{key.upper()} {kind}: {run['done']}/{count} clusters done in {run['elapsed']:.1f}s "
            f"(engage all {run['engage']:.1f}s), {figures['rss_per_cluster_mib']:.3f} MiB/cluster, "
            f"{sample['fds']:.0f} fds, idle {figures['idle_cpu_ms_per_s']:.1f} CPU ms/s, "
            f"health {health or '-'}"
        )
    summary = _summary(runs)
    for kind, extra in extras.items():
        summary[kind].update(extra)
    result: dict[str, Any] = {"clusters": count, "planes": len(bench.planes), "objects": sizes.fleet_objects}
    result["peers"] = summary
    if go_seconds is not None:
        result["go_seconds"] = go_seconds
        result["timeout"] = sizes.timeout
    return result


async def s9_fleet(bench: Bench) -> dict[str, Any]:
    """1,000 distinct kubeconfig files (a token user each) over every plane (see :func:`_fleet`).

    Go's file provider as shipped engages one cluster at a time and is left
    out (it would take minutes for reasons of design).
    """
    return await _fleet(bench, "s9", bench.sizes.fleet_clusters, None)


async def s12_large_fleet(bench: Bench) -> dict[str, Any]:
    """S9 at 10,000 clusters on one replica; the Go peer is stopped after its time limit, where it got."""
    sizes = large_fleet_sizes(bench.sizes)
    clusters = int(bench.notes.get("s12_clusters", sizes.clusters))  # run.py --large-fleet
    return await _fleet(bench, "s12", clusters, sizes.go_seconds)


# --- S10 the garbage collector --------------------------------------------------------------


async def s10_gc(bench: Bench) -> dict[str, Any]:
    """p99 write -> reconcile latency with a large cache, mcruntime with and without ``gc.freeze()``.

    Freezing after sync is the manager's default, so *mcruntime gc.freeze* is
    mcruntime as shipped and *mcruntime* runs with ``Manager(gc_freeze=False)``.
    """
    sizes = bench.sizes
    kinds = bench.multicluster(shipped=False)
    variants: list[tuple[str, str, tuple[str, ...]]] = [
        (kind, kind, ("--no-gc-freeze",) if kind == "mcruntime" else ()) for kind in kinds
    ]
    if "mcruntime" in bench.kinds:
        variants.append(("mcruntime gc.freeze", "mcruntime", ()))
    bench.rng.shuffle(variants)
    runs: dict[str, list[dict[str, Any]]] = {}
    for label, kind, extra in variants:
        seconds = sizes.gc_seconds
        data = await write_run(bench, kind, GC, sizes.gc_objects, sizes.gc_rate, seconds, "s10", extra)
        data.pop("latencies_ms")
        runs[label] = [data]
        bench.log(f"S10 {label}: p50 {data['p50_ms']:.1f} ms, p99 {data['p99_ms']:.1f} ms")
    return {
        "cached": len(bench.planes) * sizes.gc_objects,
        "rate": sizes.gc_rate,
        "seconds": sizes.gc_seconds,
        "peers": _summary(runs),
    }


# --- S11 a hung cluster ---------------------------------------------------------------------


async def s11_hung(bench: Bench) -> dict[str, Any]:
    """Healthy clusters' latency while one of three kube-apiservers is stopped (SIGSTOP).

    The reconcile reads live (``client.get`` / Go's API reader), with each
    runtime's default controller options. While the peer is paused, a burst of
    writes lands in the third cluster and its server stops, so once the peer
    resumes its reconciles of that cluster read from a server that no longer
    answers; then the writer patches the two healthy clusters for
    ``hung_seconds``. The server always gets SIGCONT again.
    """
    sizes = bench.sizes
    if len(bench.planes) < 3:
        raise BenchError("S11 needs at least three planes")
    planes = bench.planes[:3]
    hung = planes[2]
    runs: dict[str, list[dict[str, Any]]] = {}
    for kind in bench.multicluster(shipped=False):
        directory = bench.directory(f"s11-{kind}")
        targets = [(f"s11-{plane.name}", plane) for plane in planes]
        for context, plane in targets:
            write_kubeconfig(directory / f"{plane.name}.kubeconfig", [(context, plane)])
        total = len(planes) * sizes.small_objects
        async with running(bench.peer(kind, directory, SMALL, ["--mode", "live"])) as peer:
            await peer.wait_until(_at_least(peer, total), sizes.timeout, "the initial sync")
            await asyncio.sleep(1.0)
            peer.reset()
            runs[kind] = [await _hang_and_write(bench, peer, targets, hung)]
        data = runs[kind][0]
        bench.log(
            f"S11 {kind}: healthy p50 {data['p50_ms']:.0f} ms, p99 {data['p99_ms']:.0f} ms, "
            f"{data['matched']}/{data['writes']} reconciled during the hang"
        )
    return {"rate": sizes.hung_rate, "seconds": sizes.hung_seconds, "peers": _summary(runs)}


async def _hang_and_write(
    bench: Bench, peer: Peer, targets: list[tuple[str, ControlPlane]], hung: ControlPlane
) -> dict[str, Any]:
    sizes = bench.sizes
    process = hung.apiserver.process
    if process is None or process.pid is None:
        raise BenchError(f"S11: {hung.name} has no running kube-apiserver")
    pid = process.pid
    cpu_before = peer.cpu_seconds()
    # Work for the soon-hung cluster, made certain: the peer is paused while a burst of
    # writes lands there and the server sends their watch events (they wait in the peer's
    # sockets); then the server stops and the peer resumes, so each of those reconciles
    # reads live from a server that no longer answers.
    os.kill(peer.pid, signal.SIGSTOP)
    try:
        burst = await write_load([targets[2]], SMALL, sizes.small_objects, 2000.0, sizes.small_objects / 2000)
        await asyncio.sleep(0.5)
        os.kill(pid, signal.SIGSTOP)
    finally:
        os.kill(peer.pid, signal.SIGCONT)
    stopped = time.monotonic()
    hung_wanted = {(context, name, stamp) for context, name, stamp in burst}
    try:
        rate, seconds = sizes.hung_rate, sizes.hung_seconds
        writes = await write_load(targets[:2], SMALL, sizes.small_objects, rate, seconds)
        wanted = {(context, name, stamp) for context, name, stamp in writes}
        with _TolerateTimeout():
            await peer.wait_until(
                lambda: len(_matched(peer.records, wanted)) >= len(wanted), 10.0, "the healthy reconciles"
            )
        found = _matched(peer.records, wanted)
        before_resume = len(_matched(peer.records, hung_wanted))
        hang = time.monotonic() - stopped
    finally:
        os.kill(pid, signal.SIGCONT)
    resumed = time.monotonic()
    with _TolerateTimeout():
        await peer.wait_until(
            lambda: len(_matched(peer.records, hung_wanted)) >= len(hung_wanted), 60.0, "the hung cluster"
        )
    recovered = len(_matched(peer.records, hung_wanted))
    latencies = [(at - key[2]) * 1000 for key, at in found.items()]
    return {
        "writes": len(writes),
        "matched": len(found),
        "hung_writes": len(burst),
        "hung_pending_at_stop": len(burst) - before_resume,
        "hung_done_after_resume": recovered,
        "recovery_s": time.monotonic() - resumed if recovered >= len(burst) else float("nan"),
        "hang_s": hang,
        "p50_ms": percentile(latencies, 0.5),
        "p99_ms": percentile(latencies, 0.99),
        "max_ms": max(latencies) if latencies else float("nan"),
        "cpu_s": peer.cpu_seconds() - cpu_before,
    }
