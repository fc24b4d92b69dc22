"""What a command's exit code says, and the error that ends a command before anything ran.

A process supervisor (the kubelet, systemd, a CI job) sees only the exit
code, so each outcome gets its own: a clean stop, a manager that failed, a
command line / target / settings that are wrong (nothing was started), and a
stop whose drain hit its bound (some in-flight reconciles were cancelled).
"""

from __future__ import annotations

import enum


class ExitCode(enum.IntEnum):
    """The exit codes of ``mcruntime``; documented in ``docs/guides/cli.md``."""

    OK = 0
    """Stopped after SIGTERM/SIGINT (or on its own) with nothing left in flight; or ``--check`` passed."""
    FAILED = 1
    """The manager failed while running (a provider, a runnable or the start-up raised)."""
    USAGE = 2
    """Nothing ran: a bad flag or ``MCRUNTIME_*`` variable, an unbuildable target, a failed check."""
    DRAIN_TIMEOUT = 3
    """Stopped after a signal, but the drain hit its bound (reconciles cancelled) or a 2nd signal cut it."""


class UsageError(Exception):
    """A one-line reason the command cannot run; printed, then exit :attr:`ExitCode.USAGE`."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return self.message
