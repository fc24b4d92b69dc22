"""Processes the testbed starts never outlive it."""

from __future__ import annotations

from pathlib import Path

from mcruntime.testing import Fleet, live_processes


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
