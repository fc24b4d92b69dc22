"""The README's first testbed test passes as written, in a project with pytest-asyncio's defaults.

The snippet is taken from the README itself and run by a separate pytest in a
fresh directory whose ``pytest.ini`` sets nothing (pytest-asyncio's strict
mode): the plugin marks ``async def`` tests that use its fixtures as asyncio
tests, so no ``asyncio_mode = auto`` is needed.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

README = Path(__file__).parents[1] / "README.md"


def readme_snippet() -> str:
    """The python block of the README's "The testbed in pytest" section."""
    section = README.read_text().split("## The testbed in pytest", 1)[1]
    match = re.search(r"```python\n(.*?)```", section, re.DOTALL)
    assert match is not None, "the README's testbed section has no python block"
    return match.group(1)


def test_the_readmes_testbed_snippet_passes_as_written_in_strict_mode(tmp_path: Path) -> None:
    snippet = readme_snippet()
    assert "async def test_" in snippet and "(fleet)" in snippet
    (tmp_path / "pytest.ini").write_text("[pytest]\n")  # nothing set: pytest-asyncio's strict mode
    (tmp_path / "test_readme.py").write_text(snippet)
    finished = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--testbed-clusters", "1"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    output = finished.stdout + finished.stderr
    assert finished.returncode == 0, output
    assert "1 passed" in output, output
