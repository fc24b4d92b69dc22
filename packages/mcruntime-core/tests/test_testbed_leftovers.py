"""A fleet leaves no key material behind: not when it stops, not after its process is killed."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from mcruntime.testing import Fleet, TestbedError, live_processes
from mcruntime.testing import _controlplane as controlplane
from mcruntime.testing._assets import Assets, ensure_assets
from mcruntime.testing._leftovers import OWNER_FILE, sweep_abandoned
from mcruntime.testing._process import wait_until


def _secrets(directory: Path) -> list[str]:
    names = [
        str(path.relative_to(directory))
        for path in directory.rglob("*")
        if path.name == "tokens.csv" or path.suffix in (".key", ".kubeconfig") or path.name == "etcd-data"
    ]
    return sorted(names)


def test_a_fleet_in_a_given_directory_deletes_its_keys_and_keeps_its_logs(tmp_path: Path) -> None:
    with Fleet(workdir=tmp_path / "given") as fleet:
        (plane,) = fleet.start(1)
        plane.kubeconfig_path()
        written = _secrets(tmp_path / "given")
        assert "cluster-1/admin.key" in written and "cluster-1/tokens.csv" in written, written
        assert "etcd-data" in written, written
    assert _secrets(tmp_path / "given") == []
    assert list((tmp_path / "given" / "cluster-1" / "logs").glob("*.log")), "the logs went too"
    assert (tmp_path / "given" / "cluster-1" / "ca.crt").exists()
    assert not list((tmp_path / "given").rglob(OWNER_FILE))


_KILLED = """
import sys, time
from pathlib import Path
from mcruntime.testing import Fleet

workdir = Path(sys.argv[1]) if len(sys.argv) > 1 else None
fleet = Fleet(workdir=workdir)
fleet.start(1)
print(fleet.workdir, *[p.pid for p in fleet.processes()], flush=True)
time.sleep(300)
"""


def _killed_fleet(*argv: str, tmpdir: Path | None = None) -> Path:
    """A process that starts a fleet and is SIGKILLed: its directory, as it was left.

    ``tmpdir``: the process's temporary directory (where a fleet without a
    ``workdir`` makes its own).
    """
    environment = {**os.environ, "TMPDIR": str(tmpdir)} if tmpdir is not None else None
    process = subprocess.Popen(
        [sys.executable, "-c", _KILLED, *argv], stdout=subprocess.PIPE, text=True, env=environment
    )
    try:
        assert process.stdout is not None
        workdir, *pids = process.stdout.readline().split()
    finally:
        process.kill()
        process.wait()
        if process.stdout is not None:
            process.stdout.close()
    assert pids, "the fleet did not start"
    # Its etcd and apiserver die with it (PR_SET_PDEATHSIG): once they are gone, nothing writes there.
    assert wait_until(lambda: not any(Path(f"/proc/{pid}").exists() for pid in pids), timeout=30)
    return Path(workdir)


@pytest.fixture
def private() -> Iterator[Path]:
    """A directory no other fleet sweeps: not the temporary directory's top, not pytest's root.

    Every fleet's start sweeps both for dead owners' key material: another test
    process starting one meanwhile (the suite's other worker) would clean the
    killed fleet's directory before the test looks at it.
    """
    directory = Path(tempfile.mkdtemp(prefix="mcruntime-leftovers-test-"))
    try:
        yield directory
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def test_the_next_start_removes_the_directory_a_killed_fleet_made_for_itself(
    private: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    workdir = _killed_fleet(tmpdir=private)
    assert workdir.parent == private
    assert "cluster-1/admin.key" in _secrets(workdir)
    monkeypatch.setattr(tempfile, "tempdir", str(private))
    sweep_abandoned()  # what the next fleet's start does first
    assert not workdir.exists()


def test_the_next_session_deletes_the_keys_a_killed_fleet_left_in_a_given_directory(private: Path) -> None:
    workdir = _killed_fleet(str(private / "session" / "testbed0"))
    assert "cluster-1/sa.key" in _secrets(workdir)
    sweep_abandoned([private])
    assert _secrets(workdir) == []
    assert list((workdir / "cluster-1" / "logs").glob("*.log")), "the logs went too"


def test_a_live_fleets_directory_is_not_swept(tmp_path: Path) -> None:
    with Fleet(workdir=tmp_path / "live") as fleet:
        fleet.start(1)
        before = _secrets(tmp_path / "live")
        sweep_abandoned([tmp_path])
        assert _secrets(tmp_path / "live") == before
        assert fleet["cluster-1"].running


def test_a_start_cut_short_leaves_no_apiserver_running(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spawned: list[int] = []
    real_spawn = controlplane.APIServer._spawn

    def spawn_then_interrupt(self: controlplane.APIServer) -> object:
        process = real_spawn(self)
        spawned.append(process.pid or 0)
        raise KeyboardInterrupt  # Ctrl-C while the apiserver starts

    with Fleet(workdir=tmp_path / "fleet") as fleet:
        monkeypatch.setattr(controlplane.APIServer, "_spawn", spawn_then_interrupt)
        with pytest.raises(KeyboardInterrupt):
            fleet.add("east")
        assert spawned and spawned[0]
        assert fleet.names == []
        assert not [p for p in live_processes() if p.pid in spawned], "the interrupted apiserver still runs"


def _crashing(path: Path) -> Path:
    path.write_text("#!/bin/sh\necho 'cannot start: boom' >&2\nexit 3\n")
    path.chmod(0o755)
    return path


def test_an_etcd_that_exits_is_named_with_its_code_and_log(tmp_path: Path) -> None:
    real = ensure_assets()
    crash = Assets(real.kube_apiserver, _crashing(tmp_path / "etcd"), "real", "test")
    with Fleet(assets=crash, workdir=tmp_path / "fleet") as fleet, pytest.raises(TestbedError) as raised:
        fleet.start(1)
    message = str(raised.value)
    assert "etcd exited with code 3" in message, message
    assert str(tmp_path / "fleet" / "logs" / "etcd.log") in message and "boom" in message, message


def test_an_apiserver_that_exits_is_named_with_its_code(tmp_path: Path) -> None:
    real = ensure_assets()
    crash = Assets(_crashing(tmp_path / "kube-apiserver"), real.etcd, "test", "real")
    with Fleet(assets=crash, workdir=tmp_path / "fleet") as fleet, pytest.raises(TestbedError) as raised:
        fleet.add("east")
    message = str(raised.value)
    assert "east: kube-apiserver (primary" in message and "exited with code 3" in message, message
    assert "boom" in message, message


def test_a_taken_port_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as taken, Fleet(workdir=tmp_path / "fleet") as fleet:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        fleet.etcd  # noqa: B018 - etcd picks its own ports first
        monkeypatch.setattr(controlplane, "free_port", lambda: port)
        with pytest.raises(TestbedError) as raised:
            fleet.add("east")
    message = str(raised.value)
    assert f"east: could not bind a loopback port after 3 attempts (ports {[port] * 3} were taken)" in message
    assert "address already in use" in str(raised.value.__cause__)
