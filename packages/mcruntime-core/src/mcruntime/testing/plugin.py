"""pytest plugin: real control planes as fixtures.

Registered through the ``pytest11`` entry point, so it is active wherever
``mcruntime-core[testing]`` is installed. It imports the testbed lazily: a
project that never asks for these fixtures pays nothing.

Fixtures:

``testbed`` (session)
    A :class:`~mcruntime.testing.Fleet` with no clusters of its own; its etcd
    starts on first use. Call ``testbed.add()`` for clusters a test may break,
    and remove them in a ``finally``: the fleet lasts the whole session, so a
    cluster one test leaves is still there for the next.
``fleet`` (session)
    A fleet of ``--testbed-clusters`` clusters (3 by default), shared by every
    test: tests use their own namespaces, never shared mutable state. With
    ``--testbed-workloads`` its clusters run workloads too.
``workload_fleet`` (session)
    Like ``fleet``, but its clusters always run kube-controller-manager,
    kube-scheduler and a kwok node: Jobs run, garbage is collected. Started
    only when a test asks for it, so other sessions keep plain, fast clusters.
``fresh_cluster`` (function)
    A new cluster for one destructive test, removed afterwards, named
    ``fresh-N`` (never a name of ``fleet``'s); it runs workloads when the
    test is marked ``@pytest.mark.testbed_workloads``.

Options: ``--testbed-backend process|container`` (default: the
``MCRUNTIME_TESTBED_BACKEND`` environment variable, else ``process``) runs every
component as a child process or as a container.

The entry point is registered by every installation of ``mcruntime-core``, with
or without the ``testing`` extra, so this module imports nothing beyond pytest
and the standard library: without the extra the plugin still loads, pytest runs
as usual, and only a test that asks for a testbed fixture fails, with a message
naming what to install.
"""

from __future__ import annotations

import importlib.util
import inspect
import os
import signal
import sys
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from mcruntime.testing import ControlPlane, Fleet

_BACKEND_VARIABLE = "MCRUNTIME_TESTBED_BACKEND"
_INSTALL_EXTRA = "pip install 'mcruntime-core[testing]'"
# What the testbed's fixtures import beyond the core's own dependencies (module: distribution).
_EXTRA_MODULES = {"cryptography": "cryptography"}


def _require_testing_extra() -> None:
    """Fail the test asking for a testbed fixture when the ``testing`` extra is missing.

    Every fixture of the plugin starts from ``testbed``, which calls this before
    anything is imported: the failure is one line naming the command, not a
    ``ModuleNotFoundError`` from inside the testbed.
    """
    missing = [dist for module, dist in _EXTRA_MODULES.items() if importlib.util.find_spec(module) is None]
    if missing:
        pytest.fail(
            "the mcruntime testbed fixtures (testbed, fleet, workload_fleet, fresh_cluster) need "
            "the 'testing' extra of mcruntime-core "
            f"({', '.join(missing)} is not installed): {_INSTALL_EXTRA}",
            pytrace=False,
        )


def pytest_addoption(parser: pytest.Parser) -> None:
    """Register ``--testbed-clusters``, ``--testbed-workloads`` and ``--testbed-backend``."""
    group = parser.getgroup("mcruntime", "mcruntime testbed")
    group.addoption(
        "--testbed-clusters",
        type=int,
        default=3,
        help="how many clusters the session-scoped `fleet` fixture starts (default 3)",
    )
    group.addoption(
        "--testbed-workloads",
        action="store_true",
        default=False,
        help="the shared `fleet` runs kube-controller-manager, kube-scheduler and kwok nodes too",
    )
    group.addoption(
        "--testbed-backend",
        choices=("process", "container"),
        default=None,
        help=f"run the testbed's components as processes or containers (default: ${_BACKEND_VARIABLE})",
    )


def pytest_configure(config: pytest.Config) -> None:
    """Declare the ``testbed_workloads`` marker; make ``--testbed-backend`` every fleet's default.

    The option is written to ``MCRUNTIME_TESTBED_BACKEND`` so that fleets a test
    builds itself (``Fleet()``) run on the same backend as the fixtures' fleets.
    """
    chosen = config.getoption("--testbed-backend", default=None)
    if chosen:
        os.environ[_BACKEND_VARIABLE] = str(chosen)
    clusters = config.getoption("--testbed-clusters", default=3)
    if isinstance(clusters, int) and clusters < 0:
        raise pytest.UsageError(f"--testbed-clusters must be at least 0, not {clusters}")
    _interrupt_on_sigterm()
    config.addinivalue_line(
        "markers",
        "testbed_workloads: the test's `fresh_cluster` runs controllers, a scheduler and kwok nodes",
    )


def _interrupt_on_sigterm() -> None:
    """Make SIGTERM stop the run as Ctrl-C does, so the fixtures' teardown deletes the fleets' keys.

    Python's default for SIGTERM ends the process at once: no ``finally``, no
    ``atexit``. The testbed's processes still die with it (the kernel sees to
    that), but its private keys, token files and etcd data stayed on disk, and
    SIGTERM is what CI timeouts and ``timeout`` send. A second SIGTERM ends the
    run at once. A handler the program installed itself is left alone.
    """
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        return

    def interrupted(_signum: int, _frame: object) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        raise KeyboardInterrupt("SIGTERM")

    signal.signal(signal.SIGTERM, interrupted)


def _backend_name(config: pytest.Config) -> str:
    chosen = config.getoption("--testbed-backend")
    return str(chosen or os.environ.get(_BACKEND_VARIABLE) or "process")


@pytest.fixture(scope="session")
def testbed(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Iterator[Fleet]:
    """The session's etcd and a place to start clusters with ``testbed.add()``."""
    _require_testing_extra()
    from mcruntime.testing import Fleet
    from mcruntime.testing._leftovers import sweep_abandoned

    # A killed session's keys: pytest keeps its last three roots (pytest-of-USER/pytest-N;
    # under xdist each worker's is a popen-gwN inside it). A --basetemp pytest empties itself.
    base = tmp_path_factory.getbasetemp()
    root = base.parent.parent if base.name.startswith("popen-gw") else base.parent
    sweep_abandoned([root] if root.name.startswith("pytest-of-") else [])
    fleet = Fleet(workdir=tmp_path_factory.mktemp("testbed"), backend=_backend_name(request.config))
    try:
        yield fleet
    finally:
        fleet.stop()


def _shared_fleet(
    testbed: Fleet, request: pytest.FixtureRequest, name: str, workloads: bool
) -> Iterator[Fleet]:
    from mcruntime.testing import Fleet

    count = int(request.config.getoption("--testbed-clusters"))
    shared = Fleet(
        assets=testbed.assets,
        workdir=testbed.workdir / name,
        etcd=testbed.etcd,
        workloads=workloads,
        backend=testbed.backend,
    )
    try:
        shared.start(count)
        yield shared
    finally:
        shared.stop()


@pytest.fixture(scope="session")
def fleet(testbed: Fleet, request: pytest.FixtureRequest) -> Iterator[Fleet]:
    """Clusters shared by the whole session; tests isolate themselves by namespace."""
    yield from _shared_fleet(testbed, request, "fleet", bool(request.config.getoption("--testbed-workloads")))


@pytest.fixture(scope="session")
def workload_fleet(testbed: Fleet, request: pytest.FixtureRequest) -> Iterator[Fleet]:
    """Shared clusters that run Pods: real Job, garbage-collection and namespace controllers, kwok nodes."""
    yield from _shared_fleet(testbed, request, "workload-fleet", True)


@pytest.fixture
def fresh_cluster(testbed: Fleet, request: pytest.FixtureRequest) -> Iterator[ControlPlane]:
    """A cluster of one test's own, for stopping, breaking and restarting."""
    workloads = request.node.get_closest_marker("testbed_workloads") is not None
    # "fresh-N", never the shared fleet's "cluster-N": a test that puts both in one
    # kubeconfig or one provider must not find two clusters of one name.
    plane = testbed.add(testbed.new_name("fresh"), workloads=workloads or None)
    try:
        yield plane
    finally:
        testbed.remove(plane.name)


TESTBED_FIXTURES = frozenset({"testbed", "fleet", "workload_fleet", "fresh_cluster"})
"""The plugin's fixtures: an ``async def`` test asking for one is an asyncio test."""


@pytest.hookimpl(wrapper=True, trylast=True)
def pytest_pycollect_makeitem(collector: pytest.Collector, name: str, obj: object) -> Any:
    """Mark ``async def`` tests that use the testbed as asyncio tests, whatever ``asyncio_mode`` says.

    Tests against a control plane are async, and pytest-asyncio's default
    (strict) mode would skip them unless each is marked: a first test copied
    from the README must pass as written. This wrapper runs inside
    pytest-asyncio's, so the mark is there when it looks. Tests that use none
    of these fixtures are left to pytest-asyncio's own rules.
    """
    result = yield
    items = result if isinstance(result, list) else [result]
    for item in items:
        if (
            isinstance(item, pytest.Function)
            and inspect.iscoroutinefunction(item.obj)
            and TESTBED_FIXTURES.intersection(item.fixturenames)
            and item.get_closest_marker("asyncio") is None
        ):
            item.add_marker(pytest.mark.asyncio)
    return result


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Fail the run if any testbed process or container outlived its fixtures, then remove it."""
    process_module = sys.modules.get("mcruntime.testing._process")
    if process_module is None:  # the testbed was never used
        return
    leftovers = [f"{process.name} (pid {process.pid})" for process in process_module.live_processes()]
    for process in process_module.live_processes():
        process.kill()
    containers_module = sys.modules.get("mcruntime.testing._containers")
    if containers_module is not None:
        leftovers += [f"container {name}" for name in containers_module.sweep_session_leftovers()]
    if not leftovers:
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line(
            f"mcruntime testbed: processes left running and killed: {', '.join(leftovers)}", red=True
        )
    session.exitstatus = pytest.ExitCode.TESTS_FAILED
