"""Where the testbed's components run: child processes (the default) or containers.

Every component (etcd, kube-apiserver, and for workload clusters
kube-controller-manager, kube-scheduler and kwok) is started through a
:class:`Backend`, which hands back a :class:`Process`. The two backends run the
same binaries with the same arguments on the same loopback ports; the container
backend runs each in its own container on the host's network, with the
cluster's files mounted at the same path, so nothing above this layer knows
which one it has.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

from ._errors import TestbedError
from ._process import ManagedProcess

BACKEND_VARIABLE = "MCRUNTIME_TESTBED_BACKEND"
"""Environment variable choosing the default backend: ``process`` or ``container``."""
BACKENDS = ("process", "container")


class Process(Protocol):
    """What the testbed needs of a running component, whichever backend runs it."""

    name: str
    log_path: Path

    @property
    def pid(self) -> int | None: ...

    @property
    def running(self) -> bool: ...

    @property
    def exit_code(self) -> int | None: ...

    def start(self) -> None: ...

    def stop(self, timeout: float = 15.0) -> None: ...

    def kill(self) -> None: ...

    def log_tail(self, lines: int = 25) -> str: ...


class Backend(Protocol):
    """Makes :class:`Process` objects; ``mounts`` are the directories the component reads and writes."""

    name: str

    def process(
        self,
        name: str,
        argv: Sequence[str],
        log_path: Path,
        *,
        mounts: Sequence[Path] = (),
        env: dict[str, str] | None = None,
    ) -> Process: ...

    def close(self) -> None: ...


class ProcessBackend:
    """Components as child processes that die with the test process (see ``_process``)."""

    name = "process"

    def process(
        self,
        name: str,
        argv: Sequence[str],
        log_path: Path,
        *,
        mounts: Sequence[Path] = (),
        env: dict[str, str] | None = None,
    ) -> Process:
        merged = {**os.environ, **env} if env else None
        return ManagedProcess(name, argv, log_path, env=merged)

    def close(self) -> None:
        """Nothing to release: each process is stopped by its owner."""


def backend_named(name: str | None = None) -> Backend:
    """The backend called ``name``, else the one ``MCRUNTIME_TESTBED_BACKEND`` names, else processes."""
    chosen = (name or os.environ.get(BACKEND_VARIABLE) or "process").strip().lower()
    if chosen == "process":
        return ProcessBackend()
    if chosen == "container":
        from ._containers import ContainerBackend

        return ContainerBackend()
    origin = "backend" if name else BACKEND_VARIABLE
    raise TestbedError(f"{origin}={chosen!r} is not a testbed backend; choose one of {', '.join(BACKENDS)}")
