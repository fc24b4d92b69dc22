"""The distribution's metadata and the import package agree."""

from importlib.metadata import distribution

import mcruntime_namespace


def test_version_matches_distribution_metadata() -> None:
    assert mcruntime_namespace.__version__ == distribution("mcruntime-provider-namespace").version


def test_depends_on_core_by_a_version_range() -> None:
    requirements = distribution("mcruntime-provider-namespace").requires or []
    core = [req for req in requirements if req.startswith("mcruntime-core")]
    assert core, requirements
    assert ">=" in core[0]
    assert "<" in core[0].replace("<=", "")
