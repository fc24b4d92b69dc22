"""What every target-taking subcommand shares: the target argument, the settings flags, logging, building.

``mcruntime run`` and (later) ``mcruntime rbac`` both name a manager and
accept the same settings, so both build it the same way: validate the
environment and flags, export the flags as ``MCRUNTIME_*``, set up logging,
then import and call the factory in the running event loop.
"""

from __future__ import annotations

import argparse
import logging

from .._manager.logging import configure_logging
from .._manager.manager import Manager
from .._manager.settings import ManagerSettings
from .errors import UsageError
from .options import add_settings_flags, export_flags, given_flags, load_settings
from .target import build_manager, parse_target

log = logging.getLogger("mcruntime.cli")

TARGET_HELP = (
    "the manager: pkg.module:factory, path/to/file.py:factory, or pkg.module holding one module-level "
    "Manager; a factory (sync or async) takes no arguments or a 'settings' parameter and returns a Manager"
)


def add_target_arguments(parser: argparse.ArgumentParser) -> None:
    """The positional target and one flag per manager setting."""
    parser.add_argument("target", help=TARGET_HELP)
    add_settings_flags(parser)


def prepare(arguments: argparse.Namespace) -> tuple[ManagerSettings, dict[str, object]]:
    """Validate settings (flags over environment), export the flags, set up logging.

    Returns the settings and the flags that were given (by field name).
    """
    flags = given_flags(arguments)
    settings = load_settings(flags)
    export_flags(flags)
    configure_logging(settings.log_level, settings.log_format)
    return settings, flags


async def load_manager(arguments: argparse.Namespace, settings: ManagerSettings) -> Manager:
    """Build the target's manager; a :class:`UsageError` says what was wrong, its cause goes to DEBUG."""
    try:
        return await build_manager(parse_target(arguments.target), settings)
    except UsageError as error:
        if error.__cause__ is not None:
            log.debug("building the manager failed", exc_info=error.__cause__)
        raise
