"""Manager settings as command-line flags: one flag per :class:`ManagerSettings` field, same name.

``--metrics-bind-address`` is ``metrics_bind_address`` is
``MCRUNTIME_METRICS_BIND_ADDRESS``: one vocabulary in the Deployment's
``env``, its ``args`` and the code. A flag wins over its variable, which wins
over the default. pydantic-settings reads the environment and validates both,
so a flag and its variable are checked by the same rules; the error names the
flag when the bad value came from a flag, and the variable otherwise.

The validated settings reach the manager two ways (see ``docs/guides/cli.md``):
the flags are written back into the process environment as ``MCRUNTIME_*``
before the factory runs, so ``Manager.from_settings()`` and
``ManagerSettings.load()`` inside it see them; and a factory with a
``settings`` parameter receives the validated object.
"""

from __future__ import annotations

import argparse
import os
import re
from collections.abc import Mapping
from typing import Any, get_args

from pydantic import ValidationError

from .._manager.settings import ENV_PREFIX, ManagerSettings, problem_of
from .errors import UsageError

_DEST_PREFIX = "setting_"


def flag_of(field: str) -> str:
    """``metrics_bind_address`` -> ``--metrics-bind-address``."""
    return "--" + field.replace("_", "-")


def variable_of(field: str) -> str:
    """``metrics_bind_address`` -> ``MCRUNTIME_METRICS_BIND_ADDRESS``."""
    return ENV_PREFIX + field.upper()


def add_settings_flags(parser: argparse.ArgumentParser) -> None:
    """Add a flag for every settings field (booleans get ``--x``/``--no-x``); defaults stay unset."""
    group = parser.add_argument_group(
        "manager settings",
        f"each flag overrides its {ENV_PREFIX}* variable (shown), which overrides the default",
    )
    for name, field in ManagerSettings.model_fields.items():
        default = field.default
        what = field.description or name.replace("_", " ")
        help_text = f"{what} ({variable_of(name)}; default {default!r})"
        keywords: dict[str, Any] = {"dest": _DEST_PREFIX + name, "default": None, "help": help_text}
        if field.annotation is bool:
            keywords["action"] = argparse.BooleanOptionalAction
        else:
            choices = get_args(field.annotation)
            if choices and all(isinstance(choice, str) for choice in choices):  # a Literal
                keywords["choices"] = choices
                keywords["type"] = str.upper if name == "log_level" else str
            keywords["metavar"] = name.split("_")[-1].upper()
        group.add_argument(flag_of(name), **keywords)


def given_flags(arguments: argparse.Namespace) -> dict[str, object]:
    """The settings fields set on the command line, by field name."""
    return {
        name: value
        for name in ManagerSettings.model_fields
        if (value := getattr(arguments, _DEST_PREFIX + name, None)) is not None
    }


def load_settings(flags: Mapping[str, object]) -> ManagerSettings:
    """The environment with ``flags`` on top, validated; a :class:`UsageError` names each bad one."""
    try:
        return ManagerSettings(**flags)  # type: ignore[arg-type]  # validated here, by pydantic
    except ValidationError as error:
        problems = []
        for detail in error.errors():
            field = str(detail["loc"][0]) if detail["loc"] else ""
            if not field:  # a check of several settings: its message names them itself
                where = ""
            elif field in flags:
                where = f"{flag_of(field)} {flags[field]!r}: "
            else:
                where = f"{variable_of(field)}={os.environ.get(variable_of(field), '')!r}: "
            problems.append(where + _as_given(problem_of(detail), flags))
        raise UsageError("invalid settings: " + "; ".join(problems)) from None


def _as_given(message: str, flags: Mapping[str, object]) -> str:
    """A check of several settings names them as variables: name those given as flags by their flag."""
    for field in flags:
        message = re.sub(rf"\b{re.escape(variable_of(field))}\b", flag_of(field), message)
    return message


def export_flags(flags: Mapping[str, object]) -> None:
    """Write the given flags into the environment, so a factory's ``ManagerSettings.load()`` sees them."""
    for name, value in flags.items():
        os.environ[variable_of(name)] = str(value).lower() if isinstance(value, bool) else str(value)
