"""The guide's conformance example is a test module a provider author can copy as it stands.

The worked driver is quoted from this repository's tests, which import helpers
(``unique``, ``secret_manifest``) that no installed package has; an author who
copied it got NameErrors. The guide now gives the module's imports and helpers
in a block of its own before the quote. Here the two blocks are put together and
every name they use must be defined, whether called at run time or only named
in an annotation.
"""

from __future__ import annotations

import ast
import builtins
import dis
import re
from collections.abc import Iterator
from pathlib import Path
from types import CodeType
from typing import Any

from mcruntime.testing.conformance import ProviderConformance, ProviderDriver

GUIDE = Path(__file__).resolve().parents[3] / "docs" / "guides" / "writing-a-provider.md"
DRIVER = "<!-- include: tests/test_secret_provider.py#driver -->"
_BLOCK = re.compile(r"```python\n(?P<body>.*?)```", re.S)


def _example() -> str:
    """The block before the quoted driver (imports and helpers), then the driver."""
    text = GUIDE.read_text()
    marker = text.index(DRIVER)
    preamble = list(_BLOCK.finditer(text, 0, marker))[-1]["body"]
    driver = _BLOCK.search(text, marker)
    assert driver is not None
    return preamble + "\n\n" + driver["body"]


def _global_loads(code: CodeType) -> Iterator[str]:
    for instruction in dis.get_instructions(code):
        if instruction.opname in {"LOAD_GLOBAL", "LOAD_NAME"}:
            yield str(instruction.argval)
    for const in code.co_consts:
        if isinstance(const, CodeType):
            yield from _global_loads(const)


def _annotation_names(tree: ast.AST) -> set[str]:
    """Names in annotations: with ``from __future__ import annotations`` they are never evaluated."""
    annotations: list[ast.expr] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.arg) and node.annotation is not None:
            annotations.append(node.annotation)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.returns is not None:
            annotations.append(node.returns)
        elif isinstance(node, ast.AnnAssign):
            annotations.append(node.annotation)
    return {name.id for note in annotations for name in ast.walk(note) if isinstance(name, ast.Name)}


def test_the_guides_conformance_example_is_a_complete_module() -> None:
    source = _example()
    tree = ast.parse(source)
    code = compile(tree, str(GUIDE), "exec")
    namespace: dict[str, Any] = {"__name__": "guide_example"}
    exec(code, namespace)  # noqa: S102 - the guide's own code: imports and class definitions
    known = set(namespace) | set(dir(builtins))
    undefined = (set(_global_loads(code)) | _annotation_names(tree)) - known
    assert sorted(undefined) == [], (
        "the guide's conformance example uses names it neither imports nor defines"
    )
    assert issubclass(namespace["SecretDriver"], ProviderDriver)
    assert issubclass(namespace["TestKubeconfigSecretProvider"], ProviderConformance)
    assert "kube_helpers" not in source  # a module of this repository's tests, not installed anywhere
