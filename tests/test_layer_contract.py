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
        "provider-file",
        "provider-kind",
        "provider-kubefed",
    ]


@pytest.mark.parametrize("source_root", PROVIDERS, ids=lambda path: path.parent.name)
def test_providers_import_only_the_public_core(source_root: Path) -> None:
    offenders = [
        f"{path.relative_to(ROOT)}:{line}: {name}"
        for path, line, name in _imports(source_root)
        if name.split(".")[0] == "mcruntime" and any(_private(part) for part in name.split(".")[1:])
    ]
    assert offenders == [], "providers must use mcruntime's public API only"


def test_the_core_imports_no_provider() -> None:
    offenders = [
        f"{path.relative_to(ROOT)}:{line}: {name}"
        for path, line, name in _imports(CORE)
        if name.split(".")[0].startswith("mcruntime_")
    ]
    assert offenders == []
