"""Find the manager a command runs: ``pkg.module:factory``, ``pkg.module`` or ``path/file.py[:factory]``.

The target is named the way ``uvicorn`` and ``gunicorn`` users expect: a
module path (imported with the working directory on ``sys.path``, as
``python -m`` would), or a Python file (imported with its own directory on
``sys.path``, so its sibling modules import). After the colon comes an
attribute path: a factory (a function, sync or async, that returns a
:class:`Manager`) or a :class:`Manager` itself. Without a colon the module
must hold exactly one module-level :class:`Manager`.

Every way this can go wrong is a :class:`UsageError` with one line naming
the module, the attribute and what was found instead: an operator reading a
crash-looping pod's log should not need a traceback to see the typo.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

from .._config.fields import is_regular_file
from .._manager.manager import Manager
from .errors import UsageError

if TYPE_CHECKING:
    from .._manager.settings import ManagerSettings

SETTINGS_PARAMETER = "settings"
"""A factory with a parameter of this name is called with the validated :class:`ManagerSettings`."""


@dataclass(frozen=True)
class Target:
    """A parsed target: where the module comes from and which attribute (``None``: find the Manager)."""

    module: str
    """A dotted module name, or a path to a ``.py`` file."""
    attribute: str | None

    @property
    def is_file(self) -> bool:
        return self.module.endswith(".py") or "/" in self.module or "\\" in self.module

    def __str__(self) -> str:
        return f"{self.module}:{self.attribute}" if self.attribute else self.module


def parse_target(text: str) -> Target:
    """Split ``module:attribute``; raise :class:`UsageError` for a malformed target."""
    module, colon, attribute = text.rpartition(":")
    if colon and module and not attribute:
        raise UsageError(f"target {text!r}: nothing after the colon; name the factory")
    if not colon or not attribute.replace(".", "").replace("_", "a").isalnum():
        module, attribute = text, ""  # no colon, or one inside a path (C:\...)
    if not module:
        expected = "pkg.module:factory, pkg.module or path/to/file.py:factory"
        raise UsageError(f"target {text!r}: expected {expected}")
    if attribute and not all(part.isidentifier() for part in attribute.split(".")):
        raise UsageError(f"target {text!r}: {attribute!r} is not an attribute path")
    return Target(module, attribute or None)


def import_target_module(target: Target) -> ModuleType:
    """Import the target's module, turning any failure into a one-line :class:`UsageError`."""
    if target.is_file:
        return _import_file(Path(target.module))
    if "" not in sys.path and str(Path.cwd()) not in sys.path:
        sys.path.insert(0, str(Path.cwd()))  # a console script does not put the working directory there
    try:
        return importlib.import_module(target.module)
    except Exception as error:  # the user's module may raise anything while importing
        raise UsageError(f"cannot import module {target.module!r}: {_describe(error)}") from error


def _import_file(path: Path) -> ModuleType:
    try:
        found = is_regular_file(path)
    except OSError as error:  # a name too long for the file system, say
        raise UsageError(f"cannot import {str(path)[:200]!r}: {error.strerror or error}") from None
    if not found:
        raise UsageError(f"cannot import {str(path)!r}: no such file")
    # The file's own name, unless that would shadow a module already imported (operator.py, say).
    name = path.stem if path.stem.isidentifier() and path.stem not in sys.modules else "mcruntime_target"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise UsageError(f"cannot import {str(path)!r}: not a Python module")
    module = importlib.util.module_from_spec(spec)
    directory = str(path.resolve().parent)
    if directory not in sys.path:
        sys.path.insert(0, directory)  # its siblings import, as when the file is run as a script
    sys.modules[name] = module  # dataclasses and pickling look the module up by name
    try:
        spec.loader.exec_module(module)
    except Exception as error:
        del sys.modules[name]
        raise UsageError(f"cannot import {str(path)!r}: {_describe(error)}") from error
    return module


def _describe(error: BaseException) -> str:
    if isinstance(error, SyntaxError):
        return f"SyntaxError: {error.msg} ({error.filename}, line {error.lineno})"
    return f"{type(error).__name__}: {error}"


def resolve(target: Target, module: ModuleType) -> Manager | Callable[..., object]:
    """The target's Manager or factory within ``module``."""
    if target.attribute is None:
        managers = sorted(name for name, value in vars(module).items() if isinstance(value, Manager))
        if len(managers) == 1:
            found: object = getattr(module, managers[0])
            assert isinstance(found, Manager)
            return found
        if not managers:
            hint = f"name a factory: {target.module}:<function>"
            raise UsageError(f"module {target.module!r} has no module-level Manager; {hint}")
        listed = ", ".join(managers)
        count = f"{len(managers)} Managers ({listed})"
        raise UsageError(f"module {target.module!r} has {count}; name one: {target}")
    value: object = module
    walked = []
    for part in target.attribute.split("."):
        walked.append(part)
        if not hasattr(value, part):
            raise UsageError(f"module {target.module!r} has no attribute {'.'.join(walked)!r}")
        value = getattr(value, part)
    if isinstance(value, Manager):
        return value
    if not callable(value):
        raise UsageError(f"{target} is a {type(value).__name__}, not a Manager or a function returning one")
    return value


def takes_settings(factory: Callable[..., object], target: Target) -> bool:
    """Whether to pass ``settings=``; raise :class:`UsageError` if the factory wants other arguments."""
    try:
        parameters = inspect.signature(factory).parameters
    except (TypeError, ValueError):  # a builtin or a C callable: call it bare
        return False
    required = [
        name
        for name, parameter in parameters.items()
        if name != SETTINGS_PARAMETER
        and parameter.default is inspect.Parameter.empty
        and parameter.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    ]
    if required:
        raise UsageError(
            f"factory {target} requires {', '.join(required)}; "
            f"a factory takes no arguments or only {SETTINGS_PARAMETER!r} (the ManagerSettings)"
        )
    return SETTINGS_PARAMETER in parameters


async def build_manager(target: Target, settings: ManagerSettings) -> Manager:
    """Import the target and return its Manager, calling (and awaiting) a factory in the running loop.

    Called inside the event loop the manager will run on: a factory may create
    asyncio objects, or be a coroutine function. A factory that raises is a
    :class:`UsageError` too (nothing was started), with the exception's type
    and message; the traceback stays on the error's ``__cause__`` for ``--log-level DEBUG``.
    """
    found = resolve(target, import_target_module(target))
    if isinstance(found, Manager):
        return found
    arguments = {SETTINGS_PARAMETER: settings} if takes_settings(found, target) else {}
    try:
        result = found(**arguments)
        if inspect.isawaitable(result):
            result = await result
    except UsageError:
        raise
    except Exception as error:
        raise UsageError(f"factory {target} raised {_describe(error)}") from error
    if not isinstance(result, Manager):
        raise UsageError(f"factory {target} returned {type(result).__name__}, not a Manager")
    return result
