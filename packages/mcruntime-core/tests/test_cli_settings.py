"""Settings the command line must refuse at start (exit 2, one line), and those it applies itself."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from test_cli_options import _noop, clean_environment  # noqa: F401 -- clean_environment: autouse
from test_cli_run import mcruntime

import mcruntime as mcr
from mcruntime._cli.check import problems
from mcruntime._cli.main import main

CONFIGMAP = mcr.Kind("v1", "ConfigMap")

NO_SETTINGS = """
import mcruntime as mcr

CONFIGMAP = mcr.Kind("v1", "ConfigMap")


async def _noop(request):
    return None


def nosettings():
    manager = mcr.Manager(mcr.StaticProvider())
    mcr.controller_managed_by(manager).for_(CONFIGMAP, clusters=mcr.EVERY_CLUSTER).complete(_noop)
    return manager
"""


@pytest.mark.parametrize(
    ("flags", "variables", "named", "why"),
    [
        (
            ["--health-probe-bind-address", "localhost"],
            {},
            "--health-probe-bind-address 'localhost'",
            "expected",
        ),
        (["--health-probe-bind-address", ":99999"], {}, "--health-probe-bind-address ':99999'", "0-65535"),
        (["--metrics-bind-address", "::1:8080"], {}, "--metrics-bind-address '::1:8080'", "in brackets"),
        (
            [],
            {"MCRUNTIME_METRICS_BIND_ADDRESS": "localhost"},
            "MCRUNTIME_METRICS_BIND_ADDRESS='localhost'",
            "",
        ),
        (["--webhook-bind-address", "nonsense"], {}, "--webhook-bind-address 'nonsense'", "expected"),
        (["--graceful-shutdown-timeout", "inf"], {}, "--graceful-shutdown-timeout 'inf'", "finite"),
        (["--graceful-shutdown-timeout", "nan"], {}, "--graceful-shutdown-timeout 'nan'", "finite"),
        (["--graceful-shutdown-timeout", "1e300"], {}, "--graceful-shutdown-timeout '1e300'", "86400"),
        (["--lease-duration", "inf"], {}, "--lease-duration 'inf'", "finite"),
        ([], {"MCRUNTIME_CACHE_SYNC_TIMEOUT": "inf"}, "MCRUNTIME_CACHE_SYNC_TIMEOUT='inf'", "finite"),
    ],
)
@pytest.mark.parametrize("check", [False, True], ids=["run", "check"])
def test_a_setting_that_could_not_work_exits_2_naming_it(
    flags: list[str],
    variables: dict[str, str],
    named: str,
    why: str,
    check: bool,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    # Refused before the target is imported: it does not exist.
    code = main(["run", "never_imported:factory", *flags, *(["--check"] if check else [])])
    assert code == 2
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith(f"mcruntime run: error: invalid settings: {named}: "), line
    assert why in line


@pytest.mark.parametrize(
    "flags",
    [
        {"log_format": "json"},
        {"log_level": "DEBUG"},
        {"event_loop": "asyncio"},
        {"log_format": "json", "log_level": "DEBUG", "event_loop": "uvloop"},
    ],
)
def test_flags_the_command_applies_itself_are_not_ignored_by_a_factory_without_settings(
    flags: dict[str, object],
) -> None:
    manager = mcr.Manager(mcr.StaticProvider())
    mcr.controller_managed_by(manager).for_(CONFIGMAP).complete(_noop)
    assert problems(manager, flags) == []


def test_only_the_flags_a_factory_ignored_are_named() -> None:
    manager = mcr.Manager(mcr.StaticProvider())
    mcr.controller_managed_by(manager).for_(CONFIGMAP).complete(_noop)
    assert problems(manager, {"log_format": "json", "leader_election": True, "event_loop": "asyncio"}) == [
        "--leader-election given, but the factory built its Manager without settings: "
        "have it build Manager.from_settings(provider, settings=settings), taking the parsed settings as a 'settings' parameter (or reading MCRUNTIME_* itself with no argument)"
    ]


@pytest.mark.parametrize(
    "command",
    [
        ["run", "--check"],
        ["rbac", "--name", "op", "--namespace", "ops"],
    ],
    ids=["run-check", "rbac"],
)
async def test_log_flags_pass_with_a_factory_without_settings(command: list[str], tmp_path: Path) -> None:
    (tmp_path / "good.py").write_text(NO_SETTINGS)
    env = {name: value for name, value in os.environ.items() if not name.startswith("MCRUNTIME_")}
    subcommand, *rest = command
    code, out, err = await mcruntime(
        subcommand,
        f"{tmp_path / 'good.py'}:nosettings",
        *rest,
        "--log-format",
        "json",
        "--log-level",
        "warning",
        env=env,
    )
    assert (code, err) == (0, ""), err
    if subcommand == "run":
        assert out.splitlines()[-1] == f"ok: {tmp_path / 'good.py'}:nosettings"


def test_only_near_misses_of_a_setting_are_named_as_misspelled() -> None:
    from mcruntime._manager.settings import misspelled_variables

    environment = {
        "MCRUNTIME_LEADER_ELECTON": "true",  # two active leaders, in silence
        "MCRUNTIME_GRACEFUL_SHUTDOWN_TIMOUT": "60",
        "MCRUNTIME_LEADER_ELECTION": "true",  # a setting
        "MCRUNTIME_KIND_CLUSTERS": "east",  # the kind provider's, nothing like a setting
        "MCRUNTIME_TESTBED_BACKEND": "binaries",
        "PATH": "/bin",
    }
    assert misspelled_variables(environment) == [
        "MCRUNTIME_GRACEFUL_SHUTDOWN_TIMOUT is not a setting (did you mean MCRUNTIME_GRACEFUL_SHUTDOWN_TIMEOUT?)",
        "MCRUNTIME_LEADER_ELECTON is not a setting (did you mean MCRUNTIME_LEADER_ELECTION?)",
    ]


@pytest.mark.parametrize(
    "command",
    [["run", "--check"], ["rbac", "--name", "op", "--namespace", "ops"]],
    ids=["run-check", "rbac"],
)
async def test_a_misspelled_variable_fails_check_and_rbac_naming_the_setting(
    command: list[str], tmp_path: Path
) -> None:
    (tmp_path / "good.py").write_text(
        NO_SETTINGS.replace("mcr.Manager(", "mcr.Manager.from_settings(provider=")
    )
    env = {name: value for name, value in os.environ.items() if not name.startswith("MCRUNTIME_")}
    env["MCRUNTIME_LEADER_ELECTON"] = "true"
    subcommand, *rest = command
    code, _out, err = await mcruntime(subcommand, f"{tmp_path / 'good.py'}:nosettings", *rest, env=env)
    assert code == 2, err
    assert "MCRUNTIME_LEADER_ELECTON is not a setting (did you mean MCRUNTIME_LEADER_ELECTION?)" in err


def test_the_log_level_variable_takes_any_case_as_the_flag_does(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MCRUNTIME_LOG_LEVEL", "debug")
    assert mcr.ManagerSettings.load().log_level == "DEBUG"
    monkeypatch.setenv("MCRUNTIME_LOG_LEVEL", "loud")
    with pytest.raises(mcr.SettingsError, match="MCRUNTIME_LOG_LEVEL='loud'"):
        mcr.ManagerSettings.load()


@pytest.mark.parametrize(
    "command",
    [["run", "--check"], ["rbac", "--name", "op", "--namespace", "ops"]],
    ids=["run-check", "rbac"],
)
async def test_variables_a_factory_without_settings_ignores_are_refused(
    command: list[str], tmp_path: Path
) -> None:
    # Found by a review: a Deployment's MCRUNTIME_LEADER_ELECTION=true reached no manager whose
    # factory ignored settings; --check passed, rbac left out the Lease rules, and two replicas
    # were both active. Only flags were checked.
    (tmp_path / "good.py").write_text(NO_SETTINGS)
    env = {name: value for name, value in os.environ.items() if not name.startswith("MCRUNTIME_")}
    env |= {
        "MCRUNTIME_LEADER_ELECTION": "true",
        "MCRUNTIME_METRICS_BIND_ADDRESS": ":8080",  # the default: ignoring it changes nothing
        "MCRUNTIME_LOG_LEVEL": "warning",  # the command's own
    }
    subcommand, *rest = command
    code, _out, err = await mcruntime(subcommand, f"{tmp_path / 'good.py'}:nosettings", *rest, env=env)
    assert code == 2, err
    assert (
        "MCRUNTIME_LEADER_ELECTION='true' given, but the factory built its Manager without settings: "
        "have it build Manager.from_settings(provider, settings=settings), taking the parsed settings as a 'settings' parameter (or reading MCRUNTIME_* itself with no argument)"
    ) in err, err
    assert "METRICS_BIND_ADDRESS" not in err and "LOG_LEVEL" not in err, err


def test_a_variable_and_a_flag_ignored_together_are_named_each_as_given() -> None:
    manager = mcr.Manager(mcr.StaticProvider())
    mcr.controller_managed_by(manager).for_(CONFIGMAP).complete(_noop)
    environment = {"MCRUNTIME_SHARDING": "true", "MCRUNTIME_SHARD_NAMESPACE": "ops"}
    settings = mcr.ManagerSettings.load(
        sharding=True, shard_namespace="ops", health_probe_bind_address=":9000"
    )
    found = problems(manager, {"health_probe_bind_address": ":9000"}, settings, environment)
    assert found == [
        "--health-probe-bind-address, MCRUNTIME_SHARDING='true', MCRUNTIME_SHARD_NAMESPACE='ops' given, but the "
        "factory built its Manager without settings: have it build Manager.from_settings(provider, settings=settings), taking the parsed settings as a 'settings' parameter (or reading MCRUNTIME_* itself with no argument)"
    ]
