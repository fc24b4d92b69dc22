"""Processes the testbed starts never outlive it."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

from mcruntime.testing import Fleet, live_processes
from mcruntime.testing._process import wait_until


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split()[2]
    except FileNotFoundError:
        return False
    return state != "Z"


def test_after_the_fleet_stops_no_process_it_started_is_alive(tmp_path: Path) -> None:
    fleet = Fleet(workdir=tmp_path / "fleet")
    fleet.start(2)
    first = fleet["cluster-1"]
    first.start_secondary()
    pids = [process.pid for process in fleet.processes()]
    assert len(pids) == 4  # etcd, two primaries, one secondary
    assert all(pid is not None and _alive(pid) for pid in pids)
    fleet.stop()
    assert [pid for pid in pids if pid is not None and _alive(pid)] == []
    assert not any(process.pid in pids for process in live_processes())


def test_a_removed_cluster_is_gone_and_the_others_keep_running(tmp_path: Path) -> None:
    with Fleet(workdir=tmp_path / "fleet") as fleet:
        fleet.start(["keep", "drop"])
        dropped = fleet["drop"]
        pid = dropped.apiserver.process.pid if dropped.apiserver.process else None
        fleet.remove("drop")
        assert fleet.names == ["keep"]
        assert pid is not None
        assert not _alive(pid)
        assert not dropped.directory.exists()
        assert fleet["keep"].running


_ORPHAN_SCRIPT = """
import sys, threading, time
from pathlib import Path
from mcruntime.testing._process import ManagedProcess

def spawn() -> None:
    child = ManagedProcess("sleeper", ["sleep", "300"], Path(sys.argv[1]))
    child.start()
    print(child.pid, flush=True)

worker = threading.Thread(target=spawn)
worker.start()
worker.join()  # the spawning thread is gone; the child must not go with it
print("thread ended", flush=True)
time.sleep(300)
"""


def test_a_child_started_from_another_thread_dies_with_its_parent(tmp_path: Path) -> None:
    parent = subprocess.Popen(
        [sys.executable, "-c", _ORPHAN_SCRIPT, str(tmp_path / "sleeper.log")],
        stdout=subprocess.PIPE,
        text=True,
    )
    child = 0
    try:
        assert parent.stdout is not None
        child = int(parent.stdout.readline())
        assert parent.stdout.readline().strip() == "thread ended"
        assert _alive(child), "the child died with the thread that started it"
        parent.kill()
        parent.wait()
        assert wait_until(lambda: not _alive(child), timeout=10), "the child outlived its parent"
    finally:
        parent.kill()
        parent.wait()
        if parent.stdout is not None:
            parent.stdout.close()
        if child:
            with contextlib.suppress(ProcessLookupError):
                os.kill(child, signal.SIGKILL)
