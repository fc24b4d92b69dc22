"""The documentation site's code: every complete Python block type-checks against the real API.

Guides rot silently when an API changes; this makes a rename fail here instead.
Blocks quoted from the source (``<!-- include: ... -->``, checked character for
character by the core's tests) and blocks marked ``<!-- fragment -->`` (a protocol
sketch, a line out of context) are only compiled; every other block is a whole
program or test module and goes through ``mypy --strict``.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from mypy import api as mypy

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
_BLOCK = re.compile(r"(?P<marker><!-- [^\n]*-->\n)?```python\n(?P<body>.*?)```", re.S)


def _blocks() -> list[tuple[str, str, bool]]:
    """(where, code, complete) for every Python block of the site."""
    found = []
    for page in sorted(DOCS.rglob("*.md")):
        text = page.read_text()
        for match in _BLOCK.finditer(text):
            line = text.count("\n", 0, match.start("body"))
            marker = match["marker"] or ""
            complete = not marker.startswith(("<!-- fragment", "<!-- include:"))
            found.append((f"{page.relative_to(ROOT)}:{line}", match["body"], complete))
    return found


BLOCKS = _blocks()


def test_the_site_has_code_to_check() -> None:
    assert sum(complete for _, _, complete in BLOCKS) >= 6


@pytest.mark.parametrize(("where", "code", "complete"), BLOCKS, ids=[where for where, _, _ in BLOCKS])
def test_every_block_compiles(where: str, code: str, complete: bool) -> None:
    if code.lstrip().startswith(("class ", "async def ", "def ", "@")) or complete:
        compile(code, where, "exec")
    else:  # a fragment out of its function: it must at least parse as a body
        compile("async def _():\n" + "".join(f"    {line}\n" for line in code.splitlines()), where, "exec")


def test_complete_blocks_type_check(tmp_path: Path) -> None:
    paths = []
    for index, (where, code, complete) in enumerate(BLOCKS):
        if complete:
            path = tmp_path / f"block_{index:02d}.py"
            path.write_text(f"# {where}\n{code}")
            paths.append(str(path))
    stdout, stderr, status = mypy.run(
        [
            "--strict",
            "--no-incremental",
            "--explicit-package-bases",
            "--cache-dir",
            str(tmp_path / ".mypy"),
            *paths,
        ]
    )
    origins = {str(tmp_path / f"block_{index:02d}.py"): w for index, (w, _, _) in enumerate(BLOCKS)}
    report = "\n".join(
        line.replace(path, origin)
        for line in stdout.splitlines()
        for path, origin in origins.items()
        if line.startswith(path)
    )
    assert status == 0, report or stdout + stderr
