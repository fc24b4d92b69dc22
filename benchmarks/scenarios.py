"""Scenarios S1-S6: each runs every applicable peer, one after another, on the same planes.

Peers run one at a time, never side by side: the machine has 2 cores, and
two peers at once would measure each other. Every scenario returns plain
JSON-able data; ``report.py`` turns it into tables and plots.
"""

from __future__ import annotations

import asyncio
import json
import pstats
import random
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from io import StringIO
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness import (
    GO_JSON,
    BenchError,
    Peer,
    PeerKind,
    floor,
    percentile,
    running,
    write_kubeconfig,
    write_load,
)

from mcruntime.testing import ControlPlane

if TYPE_CHECKING:
    from sizes import Sizes

BULK = "s1"  # namespace of the S1/S2/S6 objects
SMALL = "small"  # namespace of the S3/S4/S5 objects


@dataclass
class Bench:
    """What every scenario needs: the planes, the sizes, the peers and a scratch directory."""

    planes: list[ControlPlane]
    sizes: Sizes
    kinds: dict[str, PeerKind]
    work: Path
    log: Callable[[str], None]
    go_binary: Path | None = None
    rng: random.Random = field(default_factory=lambda: random.Random(20))  # noqa: S311 (an order)
    notes: dict[str, Any] = field(default_factory=dict)  # what a profiled rerun needs
    _counter: int = field(default=0)

    def directory(self, label: str) -> Path:
        """A fresh, empty kubeconfig directory for one peer run."""
        self._counter += 1
        path = self.work / f"{self._counter:03d}-{label}"
        path.mkdir(parents=True)
        return path

    def peer(self, kind: str, directory: Path, namespace: str, extra: Sequence[str] = ()) -> Peer:
        """A peer of ``kind`` over ``directory`` (not started); its stderr goes next to it."""
        argv = [*self.kinds[kind].command(directory, namespace), *extra]
        return Peer(kind, argv, directory.with_suffix(".log"))

    def multicluster(self, shipped: bool = True, concurrent: bool = True, on_json: bool = False) -> list[str]:
        """The multi-cluster peers in a random order (drawn again per call, from a seeded generator).

        ``shipped=False`` leaves out Go's file provider as shipped: once the
        clusters are engaged it runs the same runtime as the concurrent
        variant, so steady-state scenarios need only one of them.
        ``concurrent=False`` leaves out the concurrent variant (the benchmark's
        own provider), where the provider itself is what is measured.
        ``on_json=True`` adds the concurrent variant speaking JSON (``GO_JSON``),
        for the scenarios whose cost is the wire's: S7 and S8.
        """
        wanted = ("go", "go concurrent", *((GO_JSON,) if on_json else ()), "mcruntime")
        names: list[str] = [name for name in wanted if name in self.kinds]
        if not shipped and "go" in names:
            names.remove("go")
        if not concurrent and "go concurrent" in names:
            names.remove("go concurrent")
        self.rng.shuffle(names)
        return names


def _completed_at(peer: Peer) -> float:
    """When the last object was first reconciled."""
    first: dict[tuple[str, str], float] = {}
    for cluster, name, at, _ in peer.records:
        first.setdefault((cluster, name), at)
    return max(first.values())


def _reconciled(peer: Peer) -> int:
    return sum(len(names) for names in peer.seen.values())


def _engaged_in(peer: Peer, context: str) -> Callable[[], bool]:
    """A wait condition: the peer has reconciled something in ``context``."""
    return lambda: context in peer.first


def _all_reconciled(peer: Peer, contexts: Sequence[str], objects: int) -> Callable[[], bool]:
    """A wait condition: every one of ``contexts`` has ``objects`` objects reconciled."""
    return lambda: all(len(peer.seen.get(context, ())) >= objects for context in contexts)


def _reconciled_since(peer: Peer, context: str, since: float) -> Callable[[], bool]:
    """A wait condition: a reconcile in ``context`` started after ``since``."""
    return lambda: peer.last.get(context, 0.0) > since


async def _wait_disengaged(peer: Peer, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while await peer.engaged() > 0:
        if time.monotonic() > deadline:
            raise BenchError(f"{peer.name}: a removed cluster stayed engaged for {timeout:.0f}s")
        await asyncio.sleep(0.05)


async def _ready(peer: Peer, timeout: float) -> None:
    """Wait for the peer's start line, then a moment for its provider to begin watching."""
    await peer.wait_until(lambda: peer.started is not None, timeout, "its start line")
    await peer.command("stats")  # answered once the stdin reader runs
    await asyncio.sleep(1.0)


# --- S1 ---------------------------------------------------------------------------------


async def s1_initial_sync(bench: Bench, profile: Path | None) -> dict[str, Any]:
    """Start -> all objects of all planes reconciled; the floor; optionally a profiled mcruntime run."""
    sizes = bench.sizes
    total = sizes.planes * sizes.bulk_objects
    floor_s = await floor(bench.planes, BULK, total, 5)
    result: dict[str, Any] = {"objects": total, "floor_s": floor_s, "peers": {}}
    bench.log(f"S1 floor: {result['floor_s']:.2f}s for {total} objects")
    if bench.go_binary is not None:
        result["go_floor_s"] = await go_floor(bench, total, 5)
        bench.log(f"S1 Go floor: {result['go_floor_s']:.2f}s")
    runs: dict[str, list[dict[str, float]]] = {kind: [] for kind in bench.multicluster()}
    for repeat in range(sizes.s1_repeats):  # the order is drawn anew each round
        for kind in bench.multicluster():
            runs[kind].append(await _s1_run(bench, kind, f"s1-{kind}-{repeat}"))
            bench.log(f"S1 {kind} run {repeat + 1}: {runs[kind][-1]['spawn_to_all']:.2f}s")
    for kind, done in runs.items():
        best = statistics.median(run["spawn_to_all"] for run in done)
        from_main = statistics.median(run["main_to_all"] for run in done)
        result["peers"][kind] = {
            "runs": done,
            "spawn_to_all": best,
            "main_to_all": from_main,
            "per_second": total / best,
            "per_second_main": total / from_main,
            "rss": statistics.median(run["rss"] for run in done),
            "stats": spread(done),
        }
    if profile is not None and "mcruntime" in bench.kinds:
        run = await _s1_run(bench, "mcruntime", "s1-profile", ["--profile", str(profile)])
        result["profile"] = {"spawn_to_all": run["spawn_to_all"], "top": _profile_summary(profile)}
    return result


async def _s1_run(bench: Bench, kind: str, label: str, extra: Sequence[str] = ()) -> dict[str, float]:
    total = bench.sizes.planes * bench.sizes.bulk_objects
    directory = bench.directory(label)
    for plane in bench.planes:
        write_kubeconfig(directory / f"{plane.name}.kubeconfig", [(f"s1-{plane.name}", plane)])
    async with running(bench.peer(kind, directory, BULK, extra)) as peer:
        await peer.wait_until(lambda: _reconciled(peer) >= total, bench.sizes.timeout, f"{total} reconciles")
        end = _completed_at(peer)
        sample = await peer.sample()
        assert peer.started is not None
        return {
            "spawn_to_all": end - peer.spawned,
            "main_to_all": end - peer.started,
            "per_second": total / (end - peer.spawned),
            **_memory(sample),
        }


def _memory(sample: dict[str, float]) -> dict[str, float]:
    return {key: sample[key] for key in ("rss", "rss_anon", "heap", "cpu_s", "fds")}


def spread(runs: Sequence[dict[str, float]]) -> dict[str, dict[str, float]]:
    """Min / median / max of every numeric figure over the runs."""
    keys = [key for key in runs[0] if isinstance(runs[0][key], (int, float))] if runs else []
    return {
        key: {
            "min": min(run[key] for run in runs),
            "median": statistics.median(run[key] for run in runs),
            "max": max(run[key] for run in runs),
        }
        for key in keys
    }


async def go_floor(bench: Bench, expected: int, runs: int) -> float:
    """The Go floor: the Go peer's ``-floor`` mode (client-go lists, typed decode), fastest of ``runs``."""
    assert bench.go_binary is not None
    directory = bench.directory("go-floor")
    for plane in bench.planes:
        write_kubeconfig(directory / f"{plane.name}.kubeconfig", [(f"s1-{plane.name}", plane)])
    process = await asyncio.create_subprocess_exec(
        str(bench.go_binary),
        "-kubeconfig-dir",
        str(directory),
        "-namespace",
        BULK,
        "-floor",
        str(runs),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(), bench.sizes.timeout)
    lines = [json.loads(line) for line in out.decode().splitlines() if line.strip()]
    found = [line for line in lines if line.get("ev") == "floor"]
    if process.returncode != 0 or not found or found[0]["n"] != expected:
        raise BenchError(f"the Go floor failed ({process.returncode}): {err.decode()[-2000:]} {found}")
    return float(found[0]["s"])


def _profile_summary(path: Path, limit: int = 25) -> dict[str, str]:
    """The profile's top functions by own time and by cumulative time, as text."""
    summary = {}
    for order in ("tottime", "cumulative"):
        stream = StringIO()
        stats = pstats.Stats(str(path), stream=stream)
        stats.strip_dirs().sort_stats(order).print_stats(limit)
        text = stream.getvalue()
        summary[order] = text[text.find("   ncalls") :].rstrip()
    return summary


# --- S2 ---------------------------------------------------------------------------------


async def s2_steady_state(bench: Bench) -> dict[str, Any]:
    """Write -> reconcile-start latency under a fixed write rate over every plane."""
    sizes = bench.sizes
    result: dict[str, Any] = {
        "rate": sizes.s2_rate,
        "seconds": sizes.s2_seconds,
        "repeats": sizes.s2_repeats,
        "peers": {},
    }
    runs: dict[str, list[dict[str, Any]]] = {kind: [] for kind in bench.multicluster(shipped=False)}
    for _ in range(sizes.s2_repeats):  # the order is drawn anew each round
        for kind in bench.multicluster(shipped=False):
            data = await _s2_peer(bench, kind)
            runs[kind].append(data)
            bench.log(
                f"S2 {kind}: p50 {data['p50_ms']:.1f} ms, p99 {data['p99_ms']:.1f} ms "
                f"({data['matched']}/{data['writes']} matched)"
            )
    for kind, done in runs.items():
        latencies = sorted(value for data in done for value in data["latencies_ms"])
        result["peers"][kind] = {
            "writes": sum(data["writes"] for data in done),
            "matched": sum(data["matched"] for data in done),
            "p50_ms": percentile(latencies, 0.5),
            "p99_ms": percentile(latencies, 0.99),
            "max_ms": max(latencies) if latencies else float("nan"),
            "p99_per_run_ms": [data["p99_ms"] for data in done],
            "latencies_ms": latencies,
            "rss": done[-1]["rss"],
            "stats": spread([{k: v for k, v in data.items() if k != "latencies_ms"} for data in done]),
        }
    return result


def _matched(
    records: Sequence[tuple[str, str, float, float | None]], wanted: set[tuple[str, str, float]]
) -> dict[tuple[str, str, float], float]:
    """The first reconcile start of each write, keyed by (cluster, name, stamp written)."""
    found: dict[tuple[str, str, float], float] = {}
    for cluster, name, at, written in records:
        key = (cluster, name, written if written is not None else -1.0)
        if key in wanted and key not in found:
            found[key] = at
    return found


async def _s2_peer(bench: Bench, kind: str) -> dict[str, Any]:
    sizes = bench.sizes
    return await write_run(bench, kind, BULK, sizes.bulk_objects, sizes.s2_rate, sizes.s2_seconds, "s2")


async def write_run(
    bench: Bench,
    kind: str,
    namespace: str,
    objects: int,
    rate: float,
    seconds: float,
    label: str,
    extra: Sequence[str] = (),
) -> dict[str, Any]:
    """One peer over every plane: initial sync, then ``rate`` writes/s for ``seconds``.

    Returns the write -> reconcile-start latencies and the peer's CPU seconds
    from the first write until every write's reconcile was seen (or 15 s more).
    """
    sizes = bench.sizes
    total = len(bench.planes) * objects
    directory = bench.directory(f"{label}-{kind}")
    targets = [(f"{label}-{plane.name}", plane) for plane in bench.planes]
    for context, plane in targets:
        write_kubeconfig(directory / f"{plane.name}.kubeconfig", [(context, plane)])
    async with running(bench.peer(kind, directory, namespace, extra)) as peer:
        await peer.wait_until(lambda: _reconciled(peer) >= total, sizes.timeout, "the initial sync")
        await asyncio.sleep(1.0)
        peer.reset()
        cpu_before = peer.cpu_seconds()
        writes = await write_load(targets, namespace, objects, rate, seconds)
        wanted = {(context, name, stamp) for context, name, stamp in writes}
        with _TolerateTimeout():
            await peer.wait_until(
                lambda: len(_matched(peer.records, wanted)) >= len(wanted), 15.0, "every write's reconcile"
            )
        cpu = peer.cpu_seconds() - cpu_before
        found = _matched(peer.records, wanted)
        sample = await peer.sample()
    latencies = [(at - key[2]) * 1000 for key, at in found.items()]
    span = max(stamp for _, _, stamp in writes) - min(stamp for _, _, stamp in writes) if writes else 0.0
    return {
        "writes": len(writes),
        "matched": len(found),
        "achieved_rate": len(writes) / span if span > 0 else float("nan"),
        "p50_ms": percentile(latencies, 0.5),
        "p99_ms": percentile(latencies, 0.99),
        "max_ms": max(latencies) if latencies else float("nan"),
        "latencies_ms": sorted(latencies),
        "cpu_s": cpu,
        "cpu_ms_per_1000": cpu * 1000 / len(found) * 1000 if found else float("nan"),
        "rss": sample["rss"],
        "heap": sample["heap"],
    }


class _TolerateTimeout:
    """A write whose reconcile never shows (coalesced with a later write) is counted, not fatal."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, _tb: object) -> bool:
        return isinstance(error, BenchError) and "timed out" in str(error)


# --- S3 ---------------------------------------------------------------------------------


async def s3_engage(bench: Bench) -> dict[str, Any]:
    """Kubeconfig file appears -> first reconcile there; one warm-up round, then the counted ones."""
    sizes = bench.sizes
    result: dict[str, Any] = {"rounds": sizes.s3_rounds, "peers": {}}
    variants: list[tuple[str, str, tuple[str, ...]]] = [(kind, kind, ()) for kind in bench.multicluster()]
    bench.rng.shuffle(variants)
    if "mcruntime" in bench.kinds:  # what the provider's default debounce (0.02 s) costs
        variants.append(("mcruntime debounce=0", "mcruntime", ("--debounce", "0")))
    for label, kind, extra in variants:
        directory = bench.directory(f"s3-{kind}")
        latencies: list[float] = []
        async with running(bench.peer(kind, directory, SMALL, extra)) as peer:
            await _ready(peer, sizes.timeout)
            for index in range(sizes.s3_rounds + 1):
                context = f"s3-{index:03d}"
                path = directory / f"{context}.kubeconfig"
                at = write_kubeconfig(path, [(context, bench.planes[index % len(bench.planes)])])
                await peer.wait_until(_engaged_in(peer, context), 60.0, f"a reconcile in {context}")
                if index > 0:  # round 0 warms imports and first-use paths
                    latencies.append((peer.first[context] - at) * 1000)
                path.unlink()
                await _wait_disengaged(peer, 60.0)
            cpu = peer.cpu_seconds()
        result["peers"][label] = {
            "cpu_s": cpu,
            "median_ms": statistics.median(latencies),
            "p90_ms": percentile(latencies, 0.9),
            "min_ms": min(latencies),
            "max_ms": max(latencies),
            "latencies_ms": latencies,
        }
        bench.log(f"S3 {label}: median {result['peers'][label]['median_ms']:.0f} ms")
    return result


# --- S4 ---------------------------------------------------------------------------------


async def s4_memory(bench: Bench) -> dict[str, Any]:
    """RSS with growing numbers of engaged clusters, all in one kubeconfig file rewritten per step."""
    sizes = bench.sizes
    result: dict[str, Any] = {"steps": list(sizes.s4_steps), "objects": sizes.small_objects, "peers": {}}
    for kind in bench.multicluster():
        directory = bench.directory(f"s4-{kind}")
        rows: list[dict[str, float]] = []
        async with running(bench.peer(kind, directory, SMALL)) as peer:
            await _ready(peer, sizes.timeout)
            rows.append({"n": 0.0, **await peer.sample()})
            for count in sizes.s4_steps:
                contexts = [
                    (f"s4-{index:04d}", bench.planes[index % len(bench.planes)]) for index in range(count)
                ]
                started = time.monotonic()
                write_kubeconfig(directory / "fleet.kubeconfig", contexts)
                names = [name for name, _ in contexts]
                await peer.wait_until(
                    _all_reconciled(peer, names, sizes.small_objects),
                    sizes.timeout,
                    f"{count} clusters reconciled",
                )
                engage_s = time.monotonic() - started
                await asyncio.sleep(1.0)
                rows.append({"n": float(count), "engage_s": engage_s, **await peer.sample()})
                bench.log(
                    f"S4 {kind}: {count} clusters, RSS {rows[-1]['rss']:.0f} MiB, engaged in {engage_s:.1f}s"
                )
        engaged = [row for row in rows if row["n"] > 0]
        result["peers"][kind] = {"rows": rows, "mib_per_cluster": _slope(engaged, "rss")}
    return result


def _slope(rows: Sequence[dict[str, float]], key: str) -> float:
    """Least-squares slope of ``key`` against the cluster count."""
    xs = [row["n"] for row in rows]
    ys = [row[key] for row in rows]
    if len(xs) < 2:
        return float("nan")
    mean_x, mean_y = statistics.fmean(xs), statistics.fmean(ys)
    spread = sum((x - mean_x) ** 2 for x in xs)
    return sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True)) / spread


# --- S5 ---------------------------------------------------------------------------------


def churn_samples(cycles: int) -> list[int]:
    """The cycles after which S5 samples: the first few, then every tenth, and the last."""
    points = {1, 2, 5, cycles, *range(10, cycles + 1, 10)}
    return sorted(point for point in points if point <= cycles)


async def s5_churn(bench: Bench) -> dict[str, Any]:
    """Add and remove one cluster ``s5_cycles`` times; RSS, fds and tasks along the way."""
    sizes = bench.sizes
    points = set(churn_samples(sizes.s5_cycles))
    result: dict[str, Any] = {"cycles": sizes.s5_cycles, "peers": {}}
    for kind in bench.multicluster(concurrent=False):
        directory = bench.directory(f"s5-{kind}")
        context, path = "s5-churn", directory / "churn.kubeconfig"
        rows: list[dict[str, float]] = []
        async with running(bench.peer(kind, directory, SMALL)) as peer:
            await _ready(peer, sizes.timeout)
            rows.append({"cycle": 0.0, **await peer.sample()})
            started = time.monotonic()
            for cycle in range(1, sizes.s5_cycles + 1):
                at = write_kubeconfig(path, [(context, bench.planes[0])])
                await peer.wait_until(
                    _reconciled_since(peer, context, at),
                    60.0,
                    f"churn cycle {cycle}",
                )
                path.unlink()
                await _wait_disengaged(peer, 60.0)
                if cycle in points:
                    rows.append({"cycle": float(cycle), **await peer.sample()})
            seconds = time.monotonic() - started
        reference = next((row for row in rows if row["cycle"] >= min(10, sizes.s5_cycles)), rows[-1])
        final = rows[-1]
        result["peers"][kind] = {
            "rows": rows,
            "seconds": seconds,
            "growth_after": reference["cycle"],
            "rss_growth": final["rss"] - reference["rss"],
            "fds_growth": final["fds"] - reference["fds"],
            "tasks_growth": final["tasks"] - reference["tasks"],
        }
        bench.log(
            f"S5 {kind}: RSS {rows[0]['rss']:.0f} -> {final['rss']:.0f} MiB, fds {rows[0]['fds']:.0f} -> "
            f"{final['fds']:.0f}, tasks {rows[0]['tasks']:.0f} -> {final['tasks']:.0f}"
        )
    return result


# --- S6 ---------------------------------------------------------------------------------


async def s6_single_cluster(bench: Bench) -> dict[str, Any]:
    """One cluster, the bulk namespace of the first plane: start -> all handled, every peer incl. kopf."""
    sizes = bench.sizes
    plane = bench.planes[0]
    context = f"s6-{plane.name}"
    result: dict[str, Any] = {"objects": sizes.bulk_objects, "peers": {}}
    runs: dict[str, list[dict[str, float]]] = {
        kind: [] for kind in ("go", "go concurrent", "mcruntime", "kopf") if kind in bench.kinds
    }
    for repeat in range(sizes.s6_repeats):  # the order is drawn anew each round
        order = list(runs)
        bench.rng.shuffle(order)
        for kind in order:
            directory = bench.directory(f"s6-{kind}-{repeat}")
            write_kubeconfig(directory / f"{context}.kubeconfig", [(context, plane)])
            async with running(bench.peer(kind, directory, BULK)) as peer:
                await peer.wait_until(
                    _all_reconciled(peer, [context], sizes.bulk_objects), sizes.timeout, "all handled"
                )
                end = _completed_at(peer)
                sample = await peer.sample()
                assert peer.started is not None
                runs[kind].append(
                    {"spawn_to_all": end - peer.spawned, "main_to_all": end - peer.started, **_memory(sample)}
                )
            bench.log(f"S6 {kind} run {repeat + 1}: {runs[kind][-1]['spawn_to_all']:.2f}s")
    for kind, done in runs.items():
        result["peers"][kind] = {
            "runs": done,
            "spawn_to_all": statistics.median(run["spawn_to_all"] for run in done),
            "main_to_all": statistics.median(run["main_to_all"] for run in done),
            "rss": statistics.median(run["rss"] for run in done),
            "stats": spread(done),
        }
    return result
