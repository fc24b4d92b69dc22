"""``mcruntime run``'s target loading: every way to name a manager, and a one-line error for each mistake."""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

import mcruntime as mcr
from mcruntime._cli.errors import UsageError
from mcruntime._cli.target import Target, build_manager, parse_target

SETTINGS = mcr.ManagerSettings.load(metrics_bind_address="", health_probe_bind_address="")

HEADER = """
import mcruntime as mcr

CONFIGMAP = mcr.Kind("v1", "ConfigMap")

async def _noop(request):
    return None
"""


@pytest.fixture
def package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A directory on sys.path whose modules the tests write; each test gets its own module names."""
    monkeypatch.syspath_prepend(str(tmp_path))
    before = set(sys.modules)
    yield tmp_path
    for name in set(sys.modules) - before:
        if name.startswith("cli_target_"):
            del sys.modules[name]


def write(directory: Path, name: str, body: str) -> Path:
    path = directory / f"{name}.py"
    path.write_text(HEADER + textwrap.dedent(body))
    return path


async def message_of(target: str) -> str:
    with pytest.raises(UsageError) as raised:
        await build_manager(parse_target(target), SETTINGS)
    message = str(raised.value)
    assert "\n" not in message
    return message


def test_a_target_splits_into_module_and_attribute() -> None:
    assert parse_target("pkg.mod:factory") == Target("pkg.mod", "factory")
    assert parse_target("pkg.mod:App.build") == Target("pkg.mod", "App.build")
    assert parse_target("pkg.mod") == Target("pkg.mod", None)
    assert parse_target("deploy/op.py:factory") == Target("deploy/op.py", "factory")
    assert parse_target("deploy/op.py").is_file
    assert not parse_target("pkg.mod:factory").is_file


def test_a_malformed_target_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match="not an attribute path"):
        parse_target("pkg.mod:9lives")
    with pytest.raises(UsageError, match=r"expected pkg\.module:factory"):
        parse_target(":factory")
    with pytest.raises(UsageError, match="nothing after the colon"):
        parse_target("pkg.mod:")


async def test_a_file_named_like_an_imported_module_does_not_shadow_it(tmp_path: Path) -> None:
    import operator

    path = write(tmp_path, "operator", "def factory():\n    return mcr.Manager(mcr.StaticProvider())\n")
    try:
        assert isinstance(await build_manager(parse_target(f"{path}:factory"), SETTINGS), mcr.Manager)
        assert sys.modules["operator"] is operator
    finally:
        sys.path.remove(str(tmp_path.resolve()))
        sys.modules.pop("mcruntime_target", None)


async def test_a_sync_factory_is_called(package: Path) -> None:
    write(package, "cli_target_sync", "def factory():\n    return mcr.Manager(mcr.StaticProvider())\n")
    assert isinstance(await build_manager(parse_target("cli_target_sync:factory"), SETTINGS), mcr.Manager)


async def test_an_async_factory_is_awaited_in_the_running_loop(package: Path) -> None:
    write(
        package,
        "cli_target_async",
        """
        import asyncio

        async def factory():
            asyncio.get_running_loop()
            return mcr.Manager(mcr.StaticProvider())
        """,
    )
    assert isinstance(await build_manager(parse_target("cli_target_async:factory"), SETTINGS), mcr.Manager)


async def test_a_factory_with_a_settings_parameter_receives_the_validated_settings(package: Path) -> None:
    write(
        package,
        "cli_target_settings",
        """
        def factory(settings: mcr.ManagerSettings) -> mcr.Manager:
            return mcr.Manager.from_settings(mcr.StaticProvider(), settings=settings)
        """,
    )
    manager = await build_manager(parse_target("cli_target_settings:factory"), SETTINGS)
    assert manager.settings is SETTINGS


async def test_a_module_with_one_manager_needs_no_attribute(package: Path) -> None:
    write(package, "cli_target_one", "manager = mcr.Manager(mcr.StaticProvider())\n")
    built = await build_manager(parse_target("cli_target_one"), SETTINGS)
    module = sys.modules["cli_target_one"]
    assert built is module.manager


async def test_a_file_path_imports_with_its_directory_on_the_path(tmp_path: Path) -> None:
    (tmp_path / "cli_target_sibling.py").write_text("PROVIDER = None\n")
    path = write(
        tmp_path,
        "cli_target_file",
        """
        import cli_target_sibling

        def factory():
            return mcr.Manager(cli_target_sibling.PROVIDER or mcr.StaticProvider())
        """,
    )
    try:
        assert isinstance(await build_manager(parse_target(f"{path}:factory"), SETTINGS), mcr.Manager)
    finally:
        sys.path.remove(str(tmp_path.resolve()))
        for name in ("cli_target_file", "cli_target_sibling"):
            sys.modules.pop(name, None)


async def test_a_missing_module_names_the_module_and_the_error(package: Path) -> None:
    message = await message_of("cli_target_absent.sub:factory")
    assert message == (
        "cannot import module 'cli_target_absent.sub': ModuleNotFoundError: No module named 'cli_target_absent'"
    )


async def test_a_module_that_fails_to_import_names_its_error(package: Path) -> None:
    write(package, "cli_target_broken", "import cli_target_not_there\n")
    message = await message_of("cli_target_broken:factory")
    assert "cannot import module 'cli_target_broken'" in message
    assert "No module named 'cli_target_not_there'" in message


async def test_a_syntax_error_names_the_file_and_line(package: Path) -> None:
    path = write(package, "cli_target_syntax", "def factory(:\n")
    message = await message_of(f"{path}:factory")
    assert "SyntaxError" in message and f"{path}, line" in message


async def test_a_missing_file_is_named(tmp_path: Path) -> None:
    assert (
        await message_of(f"{tmp_path}/absent.py:factory")
        == f"cannot import '{tmp_path}/absent.py': no such file"
    )


async def test_a_file_name_too_long_to_look_up_is_named_not_a_traceback(tmp_path: Path) -> None:
    message = await message_of(f"{tmp_path}/{'x' * 300}.py:factory")
    assert message.startswith(f"cannot import '{tmp_path}/xxx") and message.endswith(": File name too long")


async def test_a_missing_attribute_is_named(package: Path) -> None:
    write(package, "cli_target_attr", "def factory():\n    return None\n")
    assert (
        await message_of("cli_target_attr:fatcory") == "module 'cli_target_attr' has no attribute 'fatcory'"
    )


async def test_a_factory_returning_something_else_names_the_type(package: Path) -> None:
    write(package, "cli_target_wrong", "def factory():\n    return {'not': 'a manager'}\n")
    assert (
        await message_of("cli_target_wrong:factory")
        == "factory cli_target_wrong:factory returned dict, not a Manager"
    )


async def test_a_factory_that_raises_names_the_exception(package: Path) -> None:
    write(package, "cli_target_raises", "def factory():\n    raise RuntimeError('no kubeconfig here')\n")
    message = await message_of("cli_target_raises:factory")
    assert message == "factory cli_target_raises:factory raised RuntimeError: no kubeconfig here"


async def test_a_factory_with_other_required_parameters_is_refused(package: Path) -> None:
    write(package, "cli_target_params", "def factory(provider, settings):\n    return None\n")
    message = await message_of("cli_target_params:factory")
    assert message.startswith("factory cli_target_params:factory requires provider;")


async def test_a_target_that_is_neither_manager_nor_callable_is_named(package: Path) -> None:
    write(package, "cli_target_value", "factory = 42\n")
    assert await message_of("cli_target_value:factory") == (
        "cli_target_value:factory is a int, not a Manager or a function returning one"
    )


async def test_a_module_without_a_manager_asks_for_a_factory(package: Path) -> None:
    write(package, "cli_target_none", "def factory():\n    return None\n")
    message = await message_of("cli_target_none")
    assert (
        message
        == "module 'cli_target_none' has no module-level Manager; name a factory: cli_target_none:<function>"
    )


async def test_a_module_with_several_managers_lists_them(package: Path) -> None:
    write(
        package,
        "cli_target_two",
        "first = mcr.Manager(mcr.StaticProvider())\nsecond = mcr.Manager(mcr.StaticProvider())\n",
    )
    message = await message_of("cli_target_two")
    assert message == "module 'cli_target_two' has 2 Managers (first, second); name one: cli_target_two"
