"""``mcruntime`` (the console script) and ``python -m mcruntime``: parse, dispatch, exit."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import NoReturn

from .commands import Command, commands
from .errors import ExitCode, UsageError

PROG = "mcruntime"
INTERRUPTED = 130
"""Exit code for Ctrl-C before the manager started (the shell's 128 + SIGINT)."""


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line, like every other exit 2.

    argparse prints the whole usage block before its message; in a pod's log
    or a CI step the line that names the bad flag is then the last of twenty.
    The subcommands' parsers are of this class too (argparse makes them of
    the parent's).
    """

    def error(self, message: str) -> NoReturn:
        self.exit(ExitCode.USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser with one subparser per registered command."""
    from .. import __version__

    parser = _Parser(
        prog=PROG, description="Run and inspect mcruntime managers (multi-cluster Kubernetes controllers)."
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    subparsers = parser.add_subparsers(title="commands", dest="command", required=True, metavar="COMMAND")
    for command in commands():
        sub = subparsers.add_parser(
            command.name,
            help=command.help,
            description=command.description or command.help,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        command.configure(sub)
        sub.set_defaults(handler=command)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit code (argparse's own usage errors exit 2 too)."""
    arguments = build_parser().parse_args(argv)
    command: Command = arguments.handler
    try:
        return int(command.execute(arguments))
    except UsageError as error:
        print(f"{PROG} {command.name}: error: {error}", file=sys.stderr)
        return ExitCode.USAGE
    except KeyboardInterrupt:  # Ctrl-C before the runner owned the signal (while importing, say)
        return INTERRUPTED


def entry_point() -> None:
    """The console script: exit with :func:`main`'s code."""
    sys.exit(main())
