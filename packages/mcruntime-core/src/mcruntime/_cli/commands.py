"""The subcommand registry: each subcommand is one module exposing a :class:`Command`.

Adding a subcommand is writing ``_cli/<name>.py`` with a module-level
``COMMAND = Command(...)`` and listing that module in :data:`COMMAND_MODULES`;
``main`` builds the parser from the list. Commands that take a target (the
manager to run or inspect) share :mod:`.common`'s arguments and loading.
"""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Command:
    """A subcommand: its name, one line of help, how to add its arguments, and what it does."""

    name: str
    help: str
    configure: Callable[[argparse.ArgumentParser], None]
    """Adds the subcommand's arguments to its parser."""
    execute: Callable[[argparse.Namespace], int]
    """Runs it; returns the exit code, or raises :class:`UsageError`."""
    description: str = ""


COMMAND_MODULES = (
    "mcruntime._cli.run",
    "mcruntime._cli.rbac",
)
"""Each module defines ``COMMAND``; order is the order ``mcruntime --help`` lists them in."""


def commands() -> list[Command]:
    """Every registered subcommand."""
    found = []
    for name in COMMAND_MODULES:
        command = importlib.import_module(name).COMMAND
        if not isinstance(command, Command):
            raise TypeError(f"{name}.COMMAND is {type(command).__name__}, not a Command")
        found.append(command)
    return found
