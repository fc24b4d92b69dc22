"""The monorepo's import rules, checked on the source text.

Providers may use only the core's public API (no module or name starting with an
underscore), and the core never imports a provider. Keeping both true is what
lets a provider be versioned, and a bring-your-own provider be written, against
nothing but the documented surface.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PROVIDERS = sorted((ROOT / "packages").glob("provider-*/src"))
CORE = ROOT / "packages" / "mcruntime-core" / "src"


def _imports(source_root: Path) -> Iterator[tuple[Path, int, str]]:
    """Every imported dotted name (module, or module.name for from-imports)."""
    for path in sorted(source_root.rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    yield path, node.lineno, alias.name
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                for alias in node.names:
                    yield path, node.lineno, f"{node.module}.{alias.name}"


def _private(part: str) -> bool:
    return part.startswith("_") and not (part.startswith("__") and part.endswith("__"))


def test_every_provider_package_is_checked() -> None:
    assert [path.parent.name for path in PROVIDERS] == [
        "provider-capi",
        "provider-clusterprofile",
        "provider-file",
        "provider-kind",
        "provider-kubefed",
        "provider-namespace",
    ]


@pytest.mark.parametrize("source_root", PROVIDERS, ids=lambda path: path.parent.name)
def test_providers_import_only_the_public_core(source_root: Path) -> None:
    offenders = [
        f"{path.relative_to(ROOT)}:{line}: {name}"
        for path, line, name in _imports(source_root)
        if name.split(".")[0] == "mcruntime" and any(_private(part) for part in name.split(".")[1:])
    ]
    assert offenders == [], "providers must use mcruntime's public API only"


@pytest.mark.parametrize("source_root", PROVIDERS, ids=lambda path: path.parent.name)
def test_providers_read_informers_through_their_public_methods(source_root: Path) -> None:
    """``informer.view()``, ``list()`` and ``get()``; the store is the informer's own."""
    offenders = [
        f"{path.relative_to(ROOT)}:{node.lineno}: .store"
        for path in sorted(source_root.rglob("*.py"))
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path)))
        if isinstance(node, ast.Attribute) and node.attr == "store"
    ]
    assert offenders == []


def test_the_core_imports_no_provider() -> None:
    offenders = [
        f"{path.relative_to(ROOT)}:{line}: {name}"
        for path, line, name in _imports(CORE)
        if name.split(".")[0].startswith("mcruntime_")
    ]
    assert offenders == []


# The core's layers, bottom to top. A module may import its own layer and the layers
# below it, never one above: that keeps the client usable without the cache, the
# cache without clusters, clusters without controllers, and so on up to the manager,
# the RBAC derived from it, and the command line that runs it.
CORE_LAYERS = [
    "_base",
    "_reconcile",
    "_config",
    "_client",
    "_controllerutil",
    "_cache",
    "_fleet",
    "_control",
    "_coordination",
    "_webhook",
    "_manager",
    "_rbac",
    "_cli",
]
PACKAGE = CORE / "mcruntime"


def _layer_of(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[0] == "mcruntime" and parts[1] in CORE_LAYERS else None


def _core_imports(path: Path) -> Iterator[tuple[int, str]]:
    """Every mcruntime module ``path`` imports, relative imports resolved, TYPE_CHECKING ones included."""
    package = ["mcruntime", *path.relative_to(PACKAGE).parent.parts]
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join([*base, *(node.module.split(".") if node.module else [])])
            for alias in node.names:  # `from . import x` names a module
                yield node.lineno, module if node.module else f"{module}.{alias.name}"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name


def test_every_private_core_module_sits_in_a_layer() -> None:
    flat = sorted(
        path.name for path in PACKAGE.glob("_*.py") if path.name not in ("__init__.py", "__main__.py")
    )
    assert flat == [], "put each private module in the layer package it belongs to"
    layers = sorted(
        path.name
        for path in PACKAGE.iterdir()
        if path.is_dir() and path.name.startswith("_") and path.name != "__pycache__"  # Python's, not ours
    )
    assert layers == sorted(name for name in CORE_LAYERS)


@pytest.mark.parametrize("layer", CORE_LAYERS)
def test_a_core_layer_imports_only_itself_and_the_layers_below(layer: str) -> None:
    rank = CORE_LAYERS.index(layer)
    offenders = [
        f"{path.relative_to(ROOT)}:{line}: imports {module} (layer {target}, above {layer})"
        for path in sorted((PACKAGE / layer).rglob("*.py"))
        for line, module in _core_imports(path)
        if (target := _layer_of(module)) is not None and CORE_LAYERS.index(target) > rank
    ]
    assert offenders == []
    assert any(True for path in (PACKAGE / layer).glob("*.py") if path.name != "__init__.py")


def _core_name_imports(path: Path) -> Iterator[tuple[int, str, str]]:
    """(line, module, name) for every ``from mcruntime... import name``, relative imports resolved."""
    package = ["mcruntime", *path.relative_to(PACKAGE).parent.parts]
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.ImportFrom) and node.module:
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join([*base, *node.module.split(".")])
            for alias in node.names:
                yield node.lineno, module, alias.name


@pytest.mark.parametrize("layer", CORE_LAYERS)
def test_a_layer_imports_no_private_name_of_another(layer: str) -> None:
    """What one layer takes from another is that layer's surface, not its internals."""
    offenders = [
        f"{path.relative_to(ROOT)}:{line}: imports {name} from {module}"
        for path in sorted((PACKAGE / layer).rglob("*.py"))
        for line, module, name in _core_name_imports(path)
        if (target := _layer_of(module)) is not None and target != layer and _private(name)
    ]
    assert offenders == []


ARCHITECTURE = ROOT / "docs" / "guides" / "architecture.md"


def _documented_layers() -> list[tuple[str, list[str]]]:
    """The layer table of the architecture page: (layer, the layers it may import), in page order."""
    text = ARCHITECTURE.read_text()
    table = text.split("<!-- layers: checked by tests/test_layer_contract.py -->", 1)[1].split(
        "<!-- /layers -->"
    )[0]
    rows = []
    for line in table.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[0].startswith("`_"):
            layer = cells[0].strip("`")
            if cells[2] == "every layer below":
                allowed = CORE_LAYERS[: CORE_LAYERS.index(layer)] if layer in CORE_LAYERS else []
            else:
                allowed = [
                    part.strip().strip("`") for part in cells[2].split(",") if part.strip().startswith("`")
                ]
            rows.append((layer, allowed))
    return rows


def test_the_architecture_page_lists_the_layers_the_test_enforces() -> None:
    """The docs' layer table is this test's list, in order, each row allowed exactly the layers below."""
    documented = _documented_layers()
    assert [layer for layer, _ in documented] == CORE_LAYERS
    for layer, allowed in documented:
        assert allowed == CORE_LAYERS[: CORE_LAYERS.index(layer)], (
            f"{layer}: the page says it may import {allowed}"
        )


def test_the_architecture_page_is_in_the_docs_site() -> None:
    assert "guides/architecture.md" in (ROOT / "mkdocs.yml").read_text()


def test_the_layer_check_sees_relative_imports() -> None:
    """Guards the check itself: a known downward import must be resolved, or the test above proves nothing."""
    found = {module for _, module in _core_imports(PACKAGE / "_fleet" / "cluster.py")}
    assert "mcruntime._cache.informer" in found and "mcruntime._client.transport" in found
