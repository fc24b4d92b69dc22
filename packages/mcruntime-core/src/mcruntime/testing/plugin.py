"""pytest plugin: real control planes as fixtures.

Registered through the ``pytest11`` entry point, so it is active wherever
``mcruntime-core[testing]`` is installed. It imports the testbed lazily: a
project that never asks for these fixtures pays nothing.

Fixtures:

``testbed`` (session)
    A :class:`~mcruntime.testing.Fleet` with no clusters of its own; its etcd
    starts on first use. Call ``testbed.add()`` for clusters a test may break.
``fleet`` (session)
    A fleet of ``--testbed-clusters`` clusters (3 by default), shared by every
    test: tests use their own namespaces, never shared mutable state.
``fresh_cluster`` (function)
    A new cluster for one destructive test, removed afterwards.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from mcruntime.testing import ControlPlane, Fleet


def pytest_addoption(parser: pytest.Parser) -> None:
    """Register ``--testbed-clusters``."""
    group = parser.getgroup("mcruntime", "mcruntime testbed")
    group.addoption(
        "--testbed-clusters",
        type=int,
        default=3,
        help="how many clusters the session-scoped `fleet` fixture starts (default 3)",
    )


@pytest.fixture(scope="session")
def testbed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    """The session's etcd and a place to start clusters with ``testbed.add()``."""
    from mcruntime.testing import Fleet

    fleet = Fleet(workdir=tmp_path_factory.mktemp("testbed"))
    try:
        yield fleet
    finally:
        fleet.stop()


@pytest.fixture(scope="session")
def fleet(testbed: Fleet, request: pytest.FixtureRequest) -> Iterator[Fleet]:
    """Clusters shared by the whole session; tests isolate themselves by namespace."""
    from mcruntime.testing import Fleet

    count = int(request.config.getoption("--testbed-clusters"))
    shared = Fleet(assets=testbed.assets, workdir=testbed.workdir / "fleet", etcd=testbed.etcd)
    try:
        shared.start(count)
        yield shared
    finally:
        shared.stop()


@pytest.fixture
def fresh_cluster(testbed: Fleet) -> Iterator[ControlPlane]:
    """A cluster of one test's own, for stopping, breaking and restarting."""
    plane = testbed.add()
    try:
        yield plane
    finally:
        testbed.remove(plane.name)


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Fail the run if any testbed process outlived its fixtures, then kill it."""
    process_module = sys.modules.get("mcruntime.testing._process")
    if process_module is None:  # the testbed was never used
        return
    leftovers = process_module.live_processes()
    if not leftovers:
        return
    names = ", ".join(f"{process.name} (pid {process.pid})" for process in leftovers)
    for process in leftovers:
        process.kill()
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line(f"mcruntime testbed: processes left running and killed: {names}", red=True)
    session.exitstatus = pytest.ExitCode.TESTS_FAILED
