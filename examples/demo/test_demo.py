"""The demo, run end to end the way CI and a user run it: as a process, its output not a terminal."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

DEMO = Path(__file__).with_name("mcruntime_demo.py")


def processes_mentioning(workdir: Path) -> list[str]:
    """Command lines of live processes whose arguments mention ``workdir`` (its apiservers, its etcd)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            command = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if str(workdir) in command and "pytest" not in command:
            found.append(f"{proc.name}: {command[:120]}")
    return found


def start_demo(workdir: Path, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(DEMO), "--workdir", str(workdir), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )


@pytest.mark.timeout(240)
def test_the_demo_runs_its_scenario_and_summarises_it(tmp_path: Path) -> None:
    demo = start_demo(tmp_path / "demo")
    output, _ = demo.communicate(timeout=200)
    assert demo.returncode == 0, output

    # Plain lines, no terminal control sequences.
    assert "\x1b[" not in output
    for step in (
        "== 1/4",
        "== 2/4 a fourth cluster, 'north', joins",
        "== 3/4 'west' leaves",
        "== 4/4",
        "== done",
    ):
        assert step in output
    assert "Jobs run for real: kube-controller-manager's Job controller makes their Pods" in output
    assert "cluster 'east' serving at https://127.0.0.1:" in output and "kwok-node-1" in output
    assert "Test demo/flaky is error (east: failed" in output
    assert "cluster north engaged" in output and "cluster west left" in output

    summary = output[output.index("\nSummary\n") :]
    clusters = re.search(r"clusters seen: 4: (.*)", summary)
    assert clusters is not None
    assert set(clusters[1].split(", ")) == {"main (ready)", "east (ready)", "west (left)", "north (ready)"}
    assert "Tests: 1 finished, 1 error, 1 deleted (flaky: error, late: finished; deleted: smoke)" in summary
    reconciles = re.search(r"reconciles: job-fanout (\d+)$", summary, re.MULTILINE)
    assert reconciles is not None and int(reconciles[1]) > 0
    assert re.search(r"metrics scraped from http://127\.0\.0\.1:\d+/metrics", summary)
    assert "mcruntime_cluster_engagements_total = 4" in summary
    assert "mcruntime_cluster_disengagements_total = 1" in summary
    elapsed = re.search(r"elapsed: ([\d.]+)s", summary)
    assert elapsed is not None and float(elapsed[1]) > 0
    assert output.rstrip().endswith("demo: every control plane is stopped.")
    assert processes_mentioning(tmp_path) == []


@pytest.mark.timeout(120)
def test_ctrl_c_stops_everything_cleanly(tmp_path: Path) -> None:
    workdir = tmp_path / "demo"
    demo = start_demo(workdir, "--keep")
    assert demo.stdout is not None
    seen: list[str] = []
    deadline = time.monotonic() + 90
    # Read until the scenario is under way (its first Job exists), then press Ctrl-C.
    for line in demo.stdout:
        seen.append(line)
        if "created Job" in line or time.monotonic() > deadline:
            break
    assert any("created Job" in line for line in seen), "".join(seen)
    demo.send_signal(signal.SIGINT)
    rest, _ = demo.communicate(timeout=60)
    output = "".join(seen) + rest
    assert demo.returncode == 130, output
    assert "interrupted: shutting down" in output
    assert "\nSummary\n" in output
    assert output.rstrip().endswith("demo: every control plane is stopped.")
    assert "Traceback" not in output
    assert processes_mentioning(tmp_path) == []
