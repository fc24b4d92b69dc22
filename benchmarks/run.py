"""Benchmarks against the Go multicluster-runtime peer and kopf, on the same control planes in one run.

    hatch run bench:all            full sizes; rewrites benchmarks/RESULTS.md and its PNGs
    hatch run bench:smoke          tiny sizes into a temporary directory (CI)
    python benchmarks/run.py all --only s1,s3 --peers go,mcruntime
    python benchmarks/run.py report --results benchmarks/results.json   re-render only

Each run starts its own testbed fleet (kube-apiserver + etcd processes), seeds
it, builds the Go peer if needed, runs the chosen scenarios (see
``scenarios.py``), then writes ``results.json``, ``RESULTS.md`` and PNGs into
the output directory. A failing scenario is reported and the others still
run; the exit status is non-zero if any failed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import sys
import tempfile
import time
import traceback
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import psutil
from harness import (
    GO_SOURCE,
    build_go_peer,
    compile_python_peers,
    go_version,
    peer_kinds,
    raise_fd_limit,
    seed,
)
from report import render
from report_fleet import losing
from scenarios import (
    BULK,
    SMALL,
    Bench,
    s1_initial_sync,
    s2_steady_state,
    s3_engage,
    s4_memory,
    s5_churn,
    s6_single_cluster,
)
from scenarios_fleet import (
    FLEET,
    GC,
    WRITES,
    large_fleet_sizes,
    s7_writes,
    s8_steady_cpu,
    s9_fleet,
    s10_gc,
    s11_hung,
    s12_large_fleet,
)
from scenarios_fleet import profile as profile_scenario
from scenarios_webhook import s13_admission
from sizes import FULL, SMOKE, Sizes

import mcruntime as mcr
from mcruntime.testing import ETCD_VERSION, KUBERNETES_VERSION, Fleet

HERE = Path(__file__).resolve().parent
SCENARIOS = ("s1", "s2", "s3", "s4", "s5", "s6", "s7", "s8", "s9", "s10", "s11", "s12", "s13")
OPT_IN = ("s12",)  # left out of a full run unless named in --only: S12 alone takes about 15 minutes
_T0 = time.monotonic()


def log(message: str) -> None:
    """Progress on stderr, with the seconds since the run began."""
    print(f"[{time.monotonic() - _T0:7.1f}s] {message}", file=sys.stderr, flush=True)


def machine() -> dict[str, str]:
    """What the figures were measured on."""
    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    system = f"{platform.system()} {platform.release()}"
    try:
        for line in Path("/etc/os-release").read_text().splitlines():
            if line.startswith("PRETTY_NAME="):
                system = f"{line.split('=', 1)[1].strip(chr(34))}, kernel {platform.release()}"
    except OSError:
        pass
    modules = {}
    for line in (GO_SOURCE / "go.mod").read_text().splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0].startswith(("sigs.k8s.io/", "k8s.io/client-go")):
            modules[parts[0]] = parts[1]
    import kopf

    return {
        "CPU": cpu,
        "cores": str(os.cpu_count()),
        "memory": f"{psutil.virtual_memory().total / 2**30:.1f} GiB",
        "OS": system,
        "Python": platform.python_version(),
        "Go": go_version() or "not installed",
        "Kubernetes (kube-apiserver)": KUBERNETES_VERSION,
        "etcd": ETCD_VERSION,
        "mcruntime": mcr.__version__,
        "Go peer modules": ", ".join(f"{name} {version}" for name, version in modules.items()),
        "kopf": getattr(kopf, "__version__", "unknown"),
    }


def _load() -> str:
    """Load averages and the busiest other processes: the machine is shared with other work."""
    one, five, _ = os.getloadavg()
    return f"{one:.2f} (1 min), {five:.2f} (5 min)"


async def _run(
    bench: Bench, only: list[str], profile: Path | None, unprofiled: frozenset[str] = frozenset()
) -> tuple[dict[str, Any], list[str]]:
    sizes = bench.sizes
    started = time.monotonic()
    namespaces = {BULK: sizes.bulk_objects, SMALL: sizes.small_objects}
    wanted = {
        "s7": (WRITES, sizes.writes_objects),
        "s9": (FLEET, sizes.fleet_objects),
        "s12": (FLEET, sizes.fleet_objects),
        "s10": (GC, sizes.gc_objects),
    }
    namespaces.update(wanted[name] for name in only if name in wanted)
    for namespace, count in namespaces.items():
        await seed(bench.planes, namespace, count)
    log(f"seeded {sizes.planes} planes in {time.monotonic() - started:.0f}s")
    steps: dict[str, Callable[[], Awaitable[dict[str, Any]]]] = {
        "s1": lambda: s1_initial_sync(bench, profile),
        "s2": lambda: s2_steady_state(bench),
        "s3": lambda: s3_engage(bench),
        "s4": lambda: s4_memory(bench),
        "s5": lambda: s5_churn(bench),
        "s6": lambda: s6_single_cluster(bench),
        "s7": lambda: s7_writes(bench),
        "s8": lambda: s8_steady_cpu(bench),
        "s9": lambda: s9_fleet(bench),
        "s10": lambda: s10_gc(bench),
        "s11": lambda: s11_hung(bench),
        "s12": lambda: s12_large_fleet(bench),
        "s13": lambda: s13_admission(bench),
    }
    results: dict[str, Any] = {}
    failed: list[str] = []
    for name in only:
        log(f"{name.upper()} ...")
        began = time.monotonic()
        load = _load()
        try:
            results[name] = await steps[name]()
        except Exception as error:  # one broken scenario must not cost the others
            failed.append(name)
            results[name] = {"error": f"{type(error).__name__}: {error}"}
            log(f"{name.upper()} FAILED:\n{traceback.format_exc()}")
        results.setdefault(name, {})["scenario_seconds"] = time.monotonic() - began
        results[name]["load"] = load
    if profile is not None and "mcruntime" in bench.kinds:  # where mcruntime loses, show where its time goes
        for name in losing(results):
            if name in results and "error" not in results[name] and name not in unprofiled:
                log(f"{name.upper()}: mcruntime missed its goal; one profiled run ...")
                try:
                    found = await profile_scenario(bench, name, profile.with_name(f"profile_{name}.prof"))
                except Exception:  # a failed profile must not cost the results
                    log(f"{name.upper()} profile FAILED:\n{traceback.format_exc()}")
                    continue
                if found is not None:
                    results[name]["profile"] = found
    return results, failed


def run(
    sizes: Sizes,
    out: Path,
    only: list[str],
    peers: list[str],
    profile: bool,
    seed_value: int,
    large_fleet: int | None = None,
    unprofiled: frozenset[str] = frozenset(),
) -> int:
    """Build, start the fleet, run, write results.json, RESULTS.md and PNGs; return the exit status."""
    out.mkdir(parents=True, exist_ok=True)
    go_binary = build_go_peer(log) if any(name.startswith("go") for name in peers) else None
    compile_python_peers(log)
    description = machine()
    description["load average at start"] = _load()
    clusters = (large_fleet or large_fleet_sizes(sizes).clusters) if "s12" in only else sizes.fleet_clusters
    before, after = raise_fd_limit(4 * clusters + 4096)  # ~2.6 sockets per cluster in the peer
    if after != before:
        log(f"open-file limit raised from {before} to {after} (for {clusters} clusters)")
    description["open-file limit"] = str(after)
    with tempfile.TemporaryDirectory(prefix="mcruntime-bench-") as scratch:
        work = Path(scratch)
        with Fleet(workdir=work / "testbed") as fleet:
            log(f"starting {sizes.planes} control planes ...")
            planes = fleet.start(sizes.planes)
            kinds = {
                name: kind
                for name, kind in peer_kinds(go_binary, planes[0].kubeconfig_path()).items()
                if name in peers
            }
            order = random.Random(seed_value)  # noqa: S311 (an order, not a secret)
            bench = Bench(planes, sizes, kinds, work / "runs", log, go_binary=go_binary, rng=order)
            if large_fleet is not None:
                bench.notes["s12_clusters"] = large_fleet
            profile_path = work / "profile_s1.prof" if profile else None  # summarised into RESULTS.md
            results, failed = asyncio.run(_run(bench, only, profile_path, unprofiled))
    description["load average at end"] = _load()
    results["machine"] = description
    results["sizes"] = sizes.__dict__
    results["peers"] = peers
    results["order_seed"] = seed_value
    (out / "results.json").write_text(json.dumps(results, indent=1))
    render(results, out)
    log(f"wrote {out / 'RESULTS.md'}")
    print(f"benchmarks: {len(only) - len(failed)} passed, {len(failed)} failed")
    return 1 if failed else 0


def main() -> None:
    """Parse the command line and run."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=("all", "smoke", "report", "build"))
    parser.add_argument(
        "--out", type=Path, help="output directory (all: benchmarks/, smoke: a new temporary one)"
    )
    parser.add_argument(
        "--only",
        help=f"comma-separated scenarios, e.g. s1,s3 (all: all but {', '.join(OPT_IN)}; smoke: every one)",
    )
    parser.add_argument(
        "--peers", default="go,go concurrent,go concurrent json,mcruntime,kopf", help="comma-separated peers"
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="smoke: profile like a full run (S1, and every scenario whose goal mcruntime misses)",
    )
    parser.add_argument("--large-fleet", type=int, help="S12's clusters instead of its size (10,000 in full)")
    parser.add_argument("--no-profile", action="store_true", help="all: no profiled reruns of missed goals")
    parser.add_argument(
        "--no-profile-of",
        default="",
        help="all: comma-separated scenarios whose missed goals get no profiled rerun (s12's takes 10 min)",
    )
    parser.add_argument("--seed", type=int, help="seed of the peers' order (default: drawn, recorded)")
    parser.add_argument("--results", type=Path, help="report mode: the results.json to render")
    args = parser.parse_args()
    if args.mode == "build":  # the Go peer alone, so CI can build it beside other work
        build_go_peer(log)
        return
    if args.mode == "report":
        source = args.results or HERE / "results.json"
        render(json.loads(source.read_text()), args.out or source.parent)
        return
    default = SCENARIOS if args.mode == "smoke" else tuple(name for name in SCENARIOS if name not in OPT_IN)
    only = [name.strip().lower() for name in (args.only or ",".join(default)).split(",") if name.strip()]
    unknown = set(only) - set(SCENARIOS)
    if unknown:
        parser.error(f"unknown scenarios: {', '.join(sorted(unknown))}")
    peers = [name.strip() for name in args.peers.split(",") if name.strip()]
    seed_value = args.seed if args.seed is not None else random.SystemRandom().randrange(1 << 30)
    if args.mode == "smoke":
        out = args.out or Path(tempfile.mkdtemp(prefix="mcruntime-bench-smoke-"))
        log(f"smoke run into {out}")
        sys.exit(run(SMOKE, out, only, peers, args.profile, seed_value, args.large_fleet))
    unprofiled = frozenset(name.strip().lower() for name in args.no_profile_of.split(",") if name.strip())
    profile = not args.no_profile
    sys.exit(run(FULL, args.out or HERE, only, peers, profile, seed_value, args.large_fleet, unprofiled))


if __name__ == "__main__":
    main()
