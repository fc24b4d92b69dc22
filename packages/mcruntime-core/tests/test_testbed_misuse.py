"""A test kit used the wrong way says so, and leaves nothing behind (found by an outside review).

``start("east")`` started four clusters named e, a, s and t; a stopped fleet
started a new etcd that nothing would stop; a bad start timeout in the
environment broke the import of the pytest plugin, and so every test; SIGTERM
to pytest left the fleets' private keys and etcd data on disk.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from mcruntime.testing import ControlPlane, Fleet, TestbedError
from mcruntime.testing.__main__ import main as run_cli
from mcruntime.testing._controlplane import start_timeout
from mcruntime.testing._process import wait_until


def test_a_string_is_not_a_list_of_names_and_a_count_is_not_negative(tmp_path: Path) -> None:
    fleet = Fleet(workdir=tmp_path / "fleet")
    with pytest.raises(
        TestbedError, match="start\\(\\) takes a count or a list of names, not the string 'east'"
    ):
        fleet.start("east")
    with pytest.raises(TestbedError, match="a count of at least 0 clusters, not -2"):
        fleet.start(-2)
    with pytest.raises(TestbedError, match="cluster name 'Not_A_Name!' is not a DNS label"):
        fleet.add("Not_A_Name!")
    with pytest.raises(KeyError, match="no cluster 'nope' in the fleet; it has \\[\\]"):
        fleet.remove("nope")
    assert fleet.processes() == []  # none of it started anything
    fleet.stop()


def test_a_workdir_that_is_a_file_is_named_and_a_string_path_works(tmp_path: Path) -> None:
    taken = tmp_path / "taken"
    taken.write_text("not a directory")
    said = f"Fleet(workdir='{taken}'): that path is a file, not a directory"
    with pytest.raises(TestbedError, match=re.escape(said)):
        Fleet(workdir=taken)
    fleet = Fleet(workdir=str(tmp_path / "given"))  # a str, as a user may pass it
    assert fleet.workdir == tmp_path / "given"
    fleet.stop()


def test_a_stopped_fleet_refuses_to_start_again_and_leaves_nothing(tmp_path: Path) -> None:
    fleet = Fleet(workdir=tmp_path / "fleet")
    assert fleet.etcd.process is not None  # one started, then stopped
    fleet.stop()
    with pytest.raises(TestbedError, match="cannot add a cluster: this fleet was stopped; make a new Fleet"):
        fleet.add("again")
    with pytest.raises(TestbedError, match="cannot start etcd: this fleet was stopped"):
        fleet.compact()
    assert fleet.processes() == []
    assert not [path for path in (tmp_path / "fleet").rglob("*") if path.name in ("etcd-data", "tokens.csv")]


def test_the_start_timeout_variable_is_read_when_a_start_needs_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MCRUNTIME_TESTBED_START_TIMEOUT", "abc")
    with pytest.raises(TestbedError, match="MCRUNTIME_TESTBED_START_TIMEOUT='abc': give a positive number"):
        start_timeout()
    for bad in ("-1", "0", "inf"):
        monkeypatch.setenv("MCRUNTIME_TESTBED_START_TIMEOUT", bad)
        with pytest.raises(TestbedError, match="give a positive number of seconds"):
            start_timeout()
    monkeypatch.setenv("MCRUNTIME_TESTBED_START_TIMEOUT", "12.5")
    assert start_timeout() == 12.5
    assert start_timeout(3.0) == 3.0
    with pytest.raises(TestbedError, match="a start timeout is a positive number of seconds, not 0"):
        start_timeout(0)
    # The plugin's import no longer parses it: a bad value fails a start, not every test.
    environment = {**os.environ, "MCRUNTIME_TESTBED_START_TIMEOUT": "abc"}
    imported = subprocess.run(
        [sys.executable, "-c", "import mcruntime.testing.plugin, mcruntime.testing"],
        env=environment,
        capture_output=True,
        text=True,
        check=False,
    )
    assert imported.returncode == 0, imported.stderr


def test_the_cli_refuses_a_fleet_of_no_clusters(capsys: pytest.CaptureFixture[str]) -> None:
    for count in ("0", "-3"):
        with pytest.raises(SystemExit) as exited:
            run_cli(["fleet", "--clusters", count])
        assert exited.value.code == 2
        assert f"argument --clusters: {int(count)} is fewer than 1" in capsys.readouterr().err


def _pytest(*arguments: str) -> list[str]:
    """A pytest run of its own, as a user's shell or CI starts one."""
    return [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", *arguments]


def test_a_negative_fleet_size_is_a_usage_error(tmp_path: Path) -> None:
    (tmp_path / "test_nothing.py").write_text("def test_nothing() -> None:\n    pass\n")
    run = subprocess.run(
        _pytest("--testbed-clusters=-1", "test_nothing.py"),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
    )
    assert run.returncode == pytest.ExitCode.USAGE_ERROR
    assert "--testbed-clusters must be at least 0, not -1" in run.stderr


def test_a_fresh_cluster_is_never_named_like_one_of_the_shared_fleet(
    fresh_cluster: ControlPlane, fleet: Fleet
) -> None:
    assert fresh_cluster.name.startswith("fresh-")
    assert fresh_cluster.name not in fleet.names


def test_a_clusters_directories_are_the_users_alone(fresh_cluster: ControlPlane) -> None:
    for directory in (fresh_cluster.directory, fresh_cluster.directory.parent / "logs"):
        if directory.exists():
            assert stat.S_IMODE(directory.stat().st_mode) == 0o700, directory
    assert stat.S_IMODE(fresh_cluster.directory.stat().st_mode) == 0o700


async def test_add_async_lets_the_event_loop_run_while_the_cluster_starts(tmp_path: Path) -> None:
    fleet = Fleet(workdir=tmp_path / "fleet")
    try:
        ran = asyncio.Event()

        async def meanwhile() -> None:
            await asyncio.sleep(0)
            ran.set()

        other = asyncio.create_task(meanwhile())
        plane = await fleet.add_async("later")
        assert ran.is_set()  # it ran before the add returned: the loop was free meanwhile
        assert plane.running and fleet.names == ["later"]
        await other
    finally:
        await asyncio.to_thread(fleet.stop)


_SLEEPER = """
import asyncio
from pathlib import Path

async def test_sleep(fleet, tmp_path_factory) -> None:
    Path(tmp_path_factory.getbasetemp(), "started").write_text("x")
    await asyncio.sleep(120)
"""


def test_sigterm_to_pytest_stops_the_fleets_and_deletes_their_keys(tmp_path: Path) -> None:
    (tmp_path / "test_sleeper.py").write_text(_SLEEPER)
    (tmp_path / "pytest.ini").write_text("[pytest]\nasyncio_default_fixture_loop_scope = function\n")
    basetemp = tmp_path / "bt"
    run = subprocess.Popen(
        _pytest("--testbed-clusters=1", f"--basetemp={basetemp}", str(tmp_path / "test_sleeper.py")),
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        started = wait_until(lambda: (basetemp / "started").exists() or run.poll() is not None, 120)
        assert started and run.poll() is None, run.communicate()[0] if run.poll() is not None else "no start"
        assert list(basetemp.rglob("*.key"))  # the fleet's keys are there now
        run.send_signal(signal.SIGTERM)
        output, _ = run.communicate(timeout=120)
    finally:
        if run.poll() is None:
            run.kill()
            run.communicate()
    assert run.returncode == 2, output  # interrupted, as by Ctrl-C
    assert "KeyboardInterrupt: SIGTERM" in output
    left = [
        path.name
        for path in basetemp.rglob("*")
        if path.name.endswith(".key") or path.name in ("tokens.csv", "etcd-data")
    ]
    assert left == []
