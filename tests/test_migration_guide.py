"""The "Migrating to 1.0" guide matches the code: every old name is gone, every new one exists.

The guide's tables are the migration contract for users of 0.x. A name renamed back,
a replacement renamed again, or a row pointing at a method that never existed would
make the page lie; this test reads the tables and resolves each name against the
installed packages, so the page fails here instead of in a user's upgrade.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import re
import types
import typing
from pathlib import Path

import pytest

import mcruntime as mcr

GUIDE = Path(__file__).resolve().parent.parent / "docs" / "guides" / "migrating-to-1.0.md"
_ROW = re.compile(r"^\| (?P<first>[^|]+) \| (?P<second>[^|]+) \|", re.M)
_NAME = re.compile(r"`([A-Za-z_][\w.]*)`")
_SAME_NAME = "## Same name, new behaviour"


def _first_name(cell: str) -> str | None:
    match = _NAME.search(cell)
    return match.group(1) if match else None


def _renames() -> list[tuple[str, str | None]]:
    """(old, new or None) for every row of the tables above "Same name, new behaviour"."""
    text = GUIDE.read_text().split(_SAME_NAME)[0]
    rows = []
    for match in _ROW.finditer(text):
        old = _first_name(match["first"])
        if old is None:  # the header row
            continue
        rows.append((old, _first_name(match["second"])))
    return rows


def _same_names() -> list[str]:
    text = GUIDE.read_text().split(_SAME_NAME)[1]
    return [name for match in _ROW.finditer(text) if (name := _first_name(match["first"]))]


RENAMES = _renames()
SAME_NAMES = _same_names()


def _module_and_rest(dotted: str) -> tuple[types.ModuleType, list[str]]:
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            return importlib.import_module(".".join(parts[:cut])), parts[cut:]
        except ModuleNotFoundError:
            continue
    raise AssertionError(f"{dotted}: no importable module in the name")


def _member_of_class(cls: type, name: str) -> bool:
    """A class attribute, property, dataclass field, annotation or ``self.<name>`` assignment."""
    if hasattr(cls, name):
        return True
    if dataclasses.is_dataclass(cls) and name in {field.name for field in dataclasses.fields(cls)}:
        return True
    assigned = re.compile(rf"\bself\.{re.escape(name)}\s*(?::[^=\n]+)?=[^=]")
    for klass in cls.__mro__:
        if name in vars(klass).get("__annotations__", {}):
            return True
        if klass.__module__.startswith("mcruntime") and assigned.search(inspect.getsource(klass)):
            return True
    return False


def _exists(dotted: str) -> bool:
    """Whether ``dotted`` names something public: a module export, or a member of an exported class."""
    module, rest = _module_and_rest(dotted)
    if not rest:
        return True
    exported = getattr(module, "__all__", None)
    if exported is not None and rest[0] not in exported:
        return False
    if not hasattr(module, rest[0]):
        return False
    value: object = getattr(module, rest[0])
    for part in rest[1:]:
        if not inspect.isclass(value):
            raise AssertionError(f"{dotted}: {part!r} is looked up on a {type(value).__name__}, not a class")
        if not _member_of_class(value, part):
            return False
        value = getattr(value, part, None)
    return True


def test_the_guide_has_its_tables() -> None:
    assert len(RENAMES) >= 30, RENAMES
    assert len(SAME_NAMES) >= 5, SAME_NAMES


def test_the_changes_users_hit_first_are_listed() -> None:
    """The names a 0.x user trips over, each with a row."""
    old = {name for name, _ in RENAMES}
    for name in (
        "mcruntime.Cluster.reader",
        "mcruntime.ClusterState",
        "mcruntime.ClusterStatus.state",
        "mcruntime.Event",
        "mcruntime.StaticProvider.add",
        "mcruntime.StaticProvider.update",
        "mcruntime.KubeconfigSecretProvider.secret_statuses",
        "mcruntime_file.KubeconfigFileProvider.file_statuses",
        "mcruntime_capi.ClusterAPIProvider.workload_statuses",
        "mcruntime_kubefed.KubeFedProvider.member_statuses",
        "mcruntime_kind.KindProvider.last_error",
    ):
        assert name in old, f"the guide has no row for {name}"
    assert "mcruntime.Cache.get" in SAME_NAMES


@pytest.mark.parametrize(("old", "new"), RENAMES, ids=[old for old, _ in RENAMES])
def test_the_old_name_is_gone_and_the_new_one_exists(old: str, new: str | None) -> None:
    assert not _exists(old), f"the guide says {old} is gone, but it is still there"
    if new is not None:
        assert _exists(new), f"the guide says to use {new}, which does not exist"


@pytest.mark.parametrize("name", SAME_NAMES)
def test_every_name_of_changed_behaviour_exists(name: str) -> None:
    assert _exists(name), f"the guide describes {name}, which does not exist"


def test_cache_get_no_longer_answers_none() -> None:
    """The one change that fails at run time: ``Cache.get`` raises ``NotFound`` instead of ``None``."""
    returned = typing.get_type_hints(mcr.Cache.get)["return"]
    assert returned is not type(None) and type(None) not in typing.get_args(returned)
    assert "NotFound" in (inspect.getdoc(mcr.Cache.get) or "")
    or_none = typing.get_type_hints(mcr.Cache.get_or_none)["return"]
    assert type(None) in typing.get_args(or_none)
