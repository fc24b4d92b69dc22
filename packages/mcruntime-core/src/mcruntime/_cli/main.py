"""``mcruntime`` (the console script) and ``python -m mcruntime``: parse, dispatch, exit."""

from __future__ import annotations

import argparse
import difflib
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
        sub.set_defaults(handler=command, command_parser=sub)
    return parser


def parse_arguments(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> argparse.Namespace:
    """``parse_args``, but an unknown flag is named alone, with the nearest known one.

    argparse reports every argument it could not place in one list, and an
    unknown flag does not take the value after it: ``run --helth-probe x
    pkg:build`` makes ``x`` the target and reports ``--helth-probe pkg:build``
    as unrecognized. The flag is what the user mistyped, so that is what the
    error names.
    """
    arguments, extras = parser.parse_known_args(argv)
    if not extras:
        return arguments
    sub: argparse.ArgumentParser = getattr(arguments, "command_parser", parser)
    flags = [extra for extra in extras if extra.startswith("-") and extra != "-"]
    if not flags:
        sub.error(f"unexpected argument{'s' if len(extras) > 1 else ''}: {' '.join(extras)}")
    name = flags[0].partition("=")[0]
    known = [option for action in sub._actions for option in action.option_strings]
    nearest = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
    hint = f" (did you mean {nearest[0]}?)" if nearest else ""
    sub.error(f"unknown flag {name}{hint}")


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit code (argparse's own usage errors exit 2 too)."""
    arguments = parse_arguments(build_parser(), argv)
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
