"""How fast and how heavy the testbed's control planes are on this machine.

Starts one etcd, then control planes one after another, and prints for each:
its start time, the RSS of every apiserver after it settles, and etcd's RSS.
Stops at --max clusters or when a start takes longer than --slow seconds.
Run: hatch run python benchmarks/testbed_capacity.py --max 12
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from mcruntime.testing import Fleet


def _rss_mib(pid: int | None) -> float:
    if pid is None:
        return 0.0
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def main() -> None:
    """Grow a fleet one cluster at a time and print start time and memory."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--max", type=int, default=10)
    parser.add_argument("--slow", type=float, default=30.0)
    parser.add_argument("--settle", type=float, default=5.0, help="seconds to let a new apiserver settle")
    arguments = parser.parse_args()
    with Fleet() as fleet:
        print(f"binaries: {fleet.assets.kube_apiserver}")  # resolved (or built) before any timing
        started = time.monotonic()
        etcd_pid = fleet.etcd.process.pid if fleet.etcd.process else None
        print(f"etcd healthy in {fleet.start_seconds['etcd']:.2f}s, RSS {_rss_mib(etcd_pid):.0f} MiB")
        for index in range(arguments.max):
            plane = fleet.add()
            seconds = fleet.start_seconds[plane.name]
            time.sleep(arguments.settle)  # a measurement pause, not synchronisation
            rss = [_rss_mib(p.apiserver.process.pid if p.apiserver.process else None) for p in fleet]
            print(
                f"{index + 1:2d} clusters: last start {seconds:5.2f}s, "
                f"since etcd {time.monotonic() - started:6.1f}s, "
                f"apiserver RSS median {statistics.median(rss):.0f} MiB (max {max(rss):.0f}), "
                f"etcd RSS {_rss_mib(etcd_pid):.0f} MiB",
                flush=True,
            )
            if seconds > arguments.slow:
                print(f"stopping: a start took more than {arguments.slow}s")
                break


if __name__ == "__main__":
    main()
