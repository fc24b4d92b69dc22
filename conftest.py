"""Tests that run in parallel (pytest-xdist), and the few that must run with nothing beside them.

The suite spends most of its time waiting on API servers, so ``hatch run test:all``
runs it in two worker processes. A test marked ``alone`` (one that times a hang,
counts what a window of time saw, or loads the machine on purpose) runs with no
other test beside it: each worker takes a lock for every test, shared for an
ordinary test and exclusive for one marked ``alone``. A gate taken before either
keeps a waiting ``alone`` test from being starved by the other worker's stream of
ordinary tests. Without xdist (``-n 0``, or another interpreter's slice) nothing
here does anything.
"""

from __future__ import annotations

import fcntl
import os
import tempfile
from collections.abc import Generator
from pathlib import Path

import pytest

_WORKER = os.environ.get("PYTEST_XDIST_WORKER")
_RUN = os.environ.get("PYTEST_XDIST_TESTRUNUID")


class _Turns:
    """The run's two lock files, opened once by each worker and kept open until it ends."""

    def __init__(self, run: str) -> None:
        base = Path(tempfile.gettempdir())
        self.paths = (base / f"mcruntime-tests-{run}.gate", base / f"mcruntime-tests-{run}.turn")
        # 0o600: the files carry no data, but nobody else's process should take our locks.
        self.gate, self.turn = (os.open(path, os.O_RDWR | os.O_CREAT, 0o600) for path in self.paths)

    def take(self, alone: bool) -> None:
        fcntl.flock(self.gate, fcntl.LOCK_EX)
        try:
            fcntl.flock(self.turn, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        finally:
            fcntl.flock(self.gate, fcntl.LOCK_UN)

    def give(self) -> None:
        fcntl.flock(self.turn, fcntl.LOCK_UN)

    def close(self) -> None:
        os.close(self.gate)
        os.close(self.turn)
        # The other worker may still hold its own descriptors: an unlinked file keeps
        # working for them, and nobody opens these names again in this run.
        for path in self.paths:
            path.unlink(missing_ok=True)


_turns = _Turns(_RUN) if _WORKER and _RUN else None


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_protocol(
    item: pytest.Item, nextitem: pytest.Item | None
) -> Generator[None, object, object]:
    """Run the test's setup, call and teardown inside its turn."""
    if _turns is None:
        return (yield)
    _turns.take(alone=item.get_closest_marker("alone") is not None)
    try:
        return (yield)
    finally:
        _turns.give()


def pytest_unconfigure(config: pytest.Config) -> None:
    """Close and remove this worker's lock files."""
    if _turns is not None:
        _turns.close()
