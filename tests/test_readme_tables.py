"""Every README and guide table that names an API names one that exists.

Tables are where users look things up (options, what is refused, what is
reported), and they rot silently: a row kept pointing to ``contexts[name].error``
after 1.0 removed it, and one gave a default the code no longer had. This reads
every table row of every README and guide and checks, against the installed
packages:

- an options table (first column ``option``, ``parameter`` or ``argument``) of
  a provider's README names parameters of that provider's constructor, and a
  default written as a Python literal is the constructor's default;
- a backticked reference with attributes (``mcr.TrustPolicy.own()``,
  ``provider.sources()``, ``statuses()[name].error``, ``ClusterOptions.x``)
  resolves: its root is a module, an exported class or a known instance
  (``mgr``, ``cluster``, ``provider``...), and each attribute exists on it.

Spans that are not Python (YAML field paths such as ``spec.caBundle``, messages,
commands) have roots this test does not know and are left alone, except an
indexed one (``x[key].attr``), which is always an API reference.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
import re
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import mcruntime
import mcruntime.cache
import mcruntime.client
import mcruntime.coordination
import mcruntime.kubeconfig
import mcruntime.log
import mcruntime.provider
import mcruntime.rbac
import mcruntime.testing
import mcruntime.toolkit
import mcruntime.webhook
import mcruntime.workqueue

ROOT = Path(__file__).resolve().parent.parent
# "Migrating to 1.0" names removed APIs on purpose: tests/test_migration_guide.py checks
# that its old names are gone and its new names resolve.
HISTORY = {ROOT / "docs" / "guides" / "migrating-to-1.0.md"}
DOCUMENTS = sorted(
    path
    for path in [ROOT / "README.md", *ROOT.glob("packages/*/README.md"), *ROOT.glob("docs/**/*.md")]
    if path not in HISTORY
)

# The class a provider README's "provider" and options table are about.
PROVIDERS = {
    "provider-file": "mcruntime_file:KubeconfigFileProvider",
    "provider-kind": "mcruntime_kind:KindProvider",
    "provider-capi": "mcruntime_capi:ClusterAPIProvider",
    "provider-kubefed": "mcruntime_kubefed:KubeFedProvider",
    "provider-namespace": "mcruntime_namespace:NamespaceProvider",
    "provider-clusterprofile": "mcruntime_clusterprofile:ClusterProfileProvider",
}

# Instances the docs name by their usual variable.
INSTANCES: dict[str, Any] = {
    "mgr": mcruntime.Manager,
    "manager": mcruntime.Manager,
    "cluster": mcruntime.Cluster,
    "testbed": mcruntime.testing.Fleet,
    "fleet": mcruntime.testing.Fleet,
    "plane": mcruntime.testing.ControlPlane,
    "health": mcruntime.client.ClusterHealth,
    "sources()": mcruntime.provider.SourceStatus,
    "statuses()": mcruntime.ClusterStatus,
}

NAMESPACES = (
    mcruntime,
    mcruntime.provider,
    mcruntime.testing,
    mcruntime.toolkit,
    mcruntime.cache,
    mcruntime.client,
    mcruntime.coordination,
    mcruntime.kubeconfig,
    mcruntime.log,
    mcruntime.rbac,
    mcruntime.webhook,
    mcruntime.workqueue,
)

_SPAN = re.compile(r"`([^`]+)`")
_REFERENCE = re.compile(
    r"^(?P<root>[A-Za-z_]\w*(?:\(\))?)(?P<index>\[[^\]]*\])?(?P<attrs>(?:\.[A-Za-z_]\w*)*)(?:\(.*\))?$"
)


@dataclasses.dataclass(frozen=True)
class Row:
    document: Path
    line: int
    header: tuple[str, ...]
    cells: tuple[str, ...]

    @property
    def where(self) -> str:
        return f"{self.document.relative_to(ROOT)}:{self.line}"


def _cells(line: str) -> tuple[str, ...]:
    return tuple(cell.strip() for cell in line.strip().strip("|").split("|"))


def table_rows() -> Iterator[Row]:
    for document in DOCUMENTS:
        header: tuple[str, ...] = ()
        previous = ""
        for number, line in enumerate(document.read_text().splitlines(), 1):
            if not line.startswith("|"):
                header, previous = (), line
                continue
            if re.fullmatch(r"\|[\s:|-]+\|?", line.strip()):
                header = _cells(previous)
            elif header:
                yield Row(document, number, header, _cells(line))
            previous = line


ROWS = list(table_rows())


def provider_class(document: Path) -> type[Any] | None:
    package = document.parent.name if document.name == "README.md" else ""
    target = PROVIDERS.get(package)
    if target is None:
        return None
    module, _, name = target.partition(":")
    found: type[Any] = getattr(importlib.import_module(module), name)
    return found


def package_module(document: Path) -> types.ModuleType | None:
    target = PROVIDERS.get(document.parent.name)
    return importlib.import_module(target.partition(":")[0]) if target else None


def _assigned(cls: type[Any]) -> set[str]:
    """Attributes a class (or a base) sets on ``self`` or declares."""
    names: set[str] = set()
    for klass in cls.__mro__:
        if klass is object:
            continue
        names.update(getattr(klass, "__annotations__", {}))
        try:
            source = inspect.getsource(klass)
        except (OSError, TypeError):
            continue
        names.update(re.findall(r"self\.([A-Za-z_]\w*)\s*(?::[^=\n]+)?=", source))
    return names


def has_attribute(owner: Any, name: str) -> bool:
    if hasattr(owner, name):
        return True
    if isinstance(owner, type):
        if dataclasses.is_dataclass(owner) and name in {f.name for f in dataclasses.fields(owner)}:
            return True
        return name in _assigned(owner)
    if isinstance(owner, types.ModuleType):
        try:
            importlib.import_module(f"{owner.__name__}.{name}")
        except ImportError:
            return False
        return True
    return False


def resolve_root(root: str, document: Path) -> Any:
    """What a reference's root names, or ``None`` when it is not one this test knows."""
    if root in ("mcr", "mcruntime"):
        return mcruntime
    if root in ("provider", "provider()"):
        return provider_class(document)
    if root in INSTANCES:
        return INSTANCES[root]
    bare = root.removesuffix("()")
    if bare[:1].isupper():
        module = package_module(document)
        for namespace in (*NAMESPACES, *([module] if module else [])):
            if hasattr(namespace, bare):
                return getattr(namespace, bare)
        return None
    try:  # a standard-library module (os.pathsep, gc.freeze())
        module = importlib.import_module(bare)
    except ImportError:
        return None
    standard = str(Path(inspect.getfile(re)).parent)
    builtin = getattr(module, "__file__", None) is None
    return module if builtin or str(module.__file__).startswith(standard) else None


def check_reference(span: str, document: Path) -> str | None:
    """Why ``span`` names nothing, or ``None`` (it resolves, or it is not a reference)."""
    match = _REFERENCE.match(span)
    if match is None or not match["attrs"]:
        return None  # a bare name, or a lookup in a mapping (detail["ready"]): nothing to resolve
    root, attrs = match["root"], [name for name in match["attrs"].split(".") if name]
    owner = resolve_root(root, document)
    if owner is None:
        if match["index"]:
            return f"{span!r}: {root!r} is no API this README's package has"
        return None
    for name in attrs:
        if not has_attribute(owner, name):
            return f"{span!r}: {getattr(owner, '__name__', owner)!r} has no {name!r}"
        value = getattr(owner, name, None)
        if not isinstance(value, (type, types.ModuleType)):
            return None  # an instance attribute or a method: its value is not known here
        owner = value
    return None


def test_there_are_tables_to_check() -> None:
    assert len(ROWS) > 100
    assert any(row.header[:1] == ("option",) for row in ROWS)


@pytest.mark.parametrize("row", ROWS, ids=[row.where for row in ROWS])
def test_every_reference_in_a_table_resolves(row: Row) -> None:
    problems = [
        problem
        for cell in row.cells
        for span in _SPAN.findall(cell)
        if (problem := check_reference(span, row.document)) is not None
    ]
    assert problems == [], f"{row.where}: {problems}"


OPTION_ROWS = [
    row for row in ROWS if row.header and row.header[0].lower() in ("option", "parameter", "argument")
]


@pytest.mark.parametrize("row", OPTION_ROWS, ids=[row.where for row in OPTION_ROWS])
def test_every_option_is_a_constructor_parameter_with_its_default(row: Row) -> None:
    cls = provider_class(row.document)
    if cls is None:
        pytest.skip(f"{row.where}: not a provider's README")
    name = row.cells[0].strip("`")
    parameters = inspect.signature(cls.__init__).parameters
    assert name in parameters, f"{row.where}: {cls.__name__}() takes no {name!r}"
    if "default" not in row.header:
        return
    written = row.cells[row.header.index("default")]
    literal = re.match(r"`([^`]+)`", written)
    if literal is None:
        return
    try:
        value = ast.literal_eval(literal.group(1))
    except (ValueError, SyntaxError):
        return  # an expression (`ClusterOptions()`, `DEFAULT_INCLUDE`): not compared
    actual = parameters[name].default
    assert value == actual, f"{row.where}: {name} defaults to {actual!r}, the table says {value!r}"
