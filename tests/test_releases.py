"""Each package's release metadata agrees with itself and with the others.

A version bumped without its CHANGELOG section, a provider pinned to a core range
that excludes the core it ships with, a LICENSE copy that drifted from the
repository's, or a classifier claiming a Python that CI does not run: each is a
release that says something untrue. (`.ci/installed-wheels.sh` checks the built
wheels and sdists; this checks the sources, in every test run.)
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = sorted(path.parent for path in (ROOT / "packages").glob("*/pyproject.toml"))
# The Pythons .ci/run tests: 3.11 runs everything, .ci/python-versions.sh (3.12, 3.13) and
# .ci/python-3.14.sh a slice.
TESTED_PYTHONS = {"3.11", "3.12", "3.13", "3.14"}


def _project(package: Path) -> dict[str, Any]:
    project: dict[str, Any] = tomllib.loads((package / "pyproject.toml").read_text())["project"]
    return project


def _core_version() -> str:
    return str(_project(ROOT / "packages" / "mcruntime-core")["version"])


@pytest.mark.parametrize("package", PACKAGES, ids=[path.name for path in PACKAGES])
def test_the_changelog_has_an_unreleased_section_then_the_current_version(package: Path) -> None:
    headings = re.findall(r"^## (.+)$", (package / "CHANGELOG.md").read_text(), re.M)
    version = _project(package)["version"]
    assert headings[0] == "Unreleased", headings
    assert re.fullmatch(rf"{re.escape(version)} \(\d{{4}}-\d{{2}}-\d{{2}}\)", headings[1]), (
        f"{package.name}: the first release section should be {version} (date), not {headings[1]!r}"
    )


@pytest.mark.parametrize("package", PACKAGES, ids=[path.name for path in PACKAGES])
def test_metadata_is_complete(package: Path) -> None:
    project = _project(package)
    assert project["license"] == "Apache-2.0"
    assert project["license-files"] == ["LICENSE"]
    assert (package / "LICENSE").read_bytes() == (ROOT / "LICENSE").read_bytes()
    assert project["authors"]
    assert {"Homepage", "Repository", "Issues", "Changelog"} <= set(project["urls"])
    classifiers = project["classifiers"]
    pythons = {c.rsplit(" :: ", 1)[1] for c in classifiers if re.fullmatch(r".* :: Python :: 3\.\d+", c)}
    assert pythons == TESTED_PYTHONS, f"{package.name} claims {sorted(pythons)}"
    assert "Typing :: Typed" in classifiers
    assert any(c.startswith("Development Status :: ") for c in classifiers)
    assert project["requires-python"] == f">={min(TESTED_PYTHONS)}"
    sources = [path for path in (package / "src").iterdir() if path.is_dir()]
    assert all((source / "py.typed").is_file() for source in sources), sources


@pytest.mark.parametrize(
    "package",
    [path for path in PACKAGES if path.name != "mcruntime-core"] + [ROOT / "examples"],
    ids=lambda path: path.name,
)
def test_every_dependent_accepts_the_core_it_ships_with(package: Path) -> None:
    requirements = [Requirement(line) for line in _project(package)["dependencies"]]
    core = [req for req in requirements if req.name == "mcruntime-core"]
    assert len(core) == 1, requirements
    assert core[0].specifier.contains(_core_version()), f"{package.name}: {core[0]}"
    next_major = f"{int(_core_version().split('.')[0]) + 1}.0.0"
    assert not core[0].specifier.contains(next_major), (
        f"{package.name}: {core[0]} admits the next major version"
    )
    floor = f"{_core_version().split('.')[0]}.0"  # a dependent's floor is this major's first release
    assert f">={floor}" in str(core[0].specifier), f"{package.name}: {core[0]} admits an older major version"
