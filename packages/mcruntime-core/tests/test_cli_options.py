"""``mcruntime run``'s settings flags, the check and the parser, without a cluster."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest

import mcruntime as mcr
from mcruntime._cli.check import describe, problems
from mcruntime._cli.commands import COMMAND_MODULES, commands
from mcruntime._cli.errors import UsageError
from mcruntime._cli.main import build_parser, main
from mcruntime._cli.options import export_flags, flag_of, given_flags, load_settings, variable_of
from mcruntime._cli.run import loop_factory

CONFIGMAP = mcr.Kind("v1", "ConfigMap")


async def _noop(_request: mcr.Request) -> None:
    return None


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("MCRUNTIME_"):
            monkeypatch.delenv(name)


def flags_of(*argv: str) -> dict[str, object]:
    return given_flags(build_parser().parse_args(["run", "pkg:factory", *argv]))


def test_every_setting_has_a_flag_of_the_same_name(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["run", "--help"])
    help_text = capsys.readouterr().out
    for field in mcr.ManagerSettings.model_fields:
        assert flag_of(field) in help_text
        assert variable_of(field) in help_text


def test_only_the_flags_given_are_collected() -> None:
    assert flags_of() == {}
    assert flags_of("--metrics-bind-address", ":9090", "--leader-election", "--log-level", "debug") == {
        "metrics_bind_address": ":9090",
        "leader_election": True,
        "log_level": "DEBUG",
    }
    assert flags_of("--no-gc-freeze") == {"gc_freeze": False}


def test_a_flag_wins_over_its_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MCRUNTIME_GRACEFUL_SHUTDOWN_TIMEOUT", "12")
    monkeypatch.setenv("MCRUNTIME_SHARD_GROUP", "from-env")
    settings = load_settings(flags_of("--graceful-shutdown-timeout", "4"))
    assert settings.graceful_shutdown_timeout == 4.0
    assert settings.shard_group == "from-env"


def test_a_bad_flag_is_named_with_its_value() -> None:
    with pytest.raises(UsageError) as raised:
        load_settings(flags_of("--ready-min-share", "1.5"))
    assert (
        str(raised.value)
        == "invalid settings: --ready-min-share '1.5': Input should be less than or equal to 1"
    )


def test_the_event_loop_is_a_setting_and_uvloop_must_be_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    assert load_settings(flags_of()).event_loop == "asyncio"
    assert load_settings(flags_of("--event-loop", "uvloop")).event_loop == "uvloop"
    assert loop_factory("asyncio") is None
    factory = loop_factory("uvloop")
    assert factory is not None
    loop = factory()
    try:
        assert type(loop).__module__.startswith("uvloop")
    finally:
        loop.close()
    with pytest.raises(UsageError, match=r"--event-loop 'trio': Input should be 'asyncio' or 'uvloop'"):
        load_settings({"event_loop": "trio"})
    monkeypatch.setitem(sys.modules, "uvloop", None)  # as if it were not installed
    with pytest.raises(UsageError) as flagged:
        load_settings(flags_of("--event-loop", "uvloop"))
    assert str(flagged.value).startswith("invalid settings: --event-loop 'uvloop': ")
    assert "pip install 'mcruntime-core[uvloop]'" in str(flagged.value)
    monkeypatch.setenv("MCRUNTIME_EVENT_LOOP", "uvloop")
    with pytest.raises(UsageError, match=r"MCRUNTIME_EVENT_LOOP='uvloop': .*uvloop is not installed"):
        load_settings(flags_of())


def test_a_bad_variable_is_named_with_its_value(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MCRUNTIME_MAX_TOTAL_RECONCILES", "many")
    with pytest.raises(UsageError, match=r"^invalid settings: MCRUNTIME_MAX_TOTAL_RECONCILES='many': "):
        load_settings({})


def test_settings_that_contradict_each_other_are_explained() -> None:
    # Named as they were given: flags by their flags.
    with pytest.raises(
        UsageError, match=r"^invalid settings: --leader-election and --sharding are alternatives"
    ):
        load_settings(flags_of("--leader-election", "--sharding"))  # no "settings: settings:"


def test_a_clash_of_a_flag_and_a_variable_names_each_as_given(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MCRUNTIME_HEALTH_PROBE_BIND_ADDRESS", ":8081")
    with pytest.raises(UsageError) as raised:
        load_settings(flags_of("--webhook-bind-address", ":8081"))
    message = str(raised.value)
    assert "--webhook-bind-address ':8081' and MCRUNTIME_HEALTH_PROBE_BIND_ADDRESS ':8081'" in message, (
        message
    )
    assert "MCRUNTIME_WEBHOOK_BIND_ADDRESS" not in message


def test_exported_flags_reach_settings_loaded_inside_a_factory(monkeypatch: pytest.MonkeyPatch) -> None:
    flags = flags_of("--leader-election", "--leader-election-id", "job-fanout", "--lease-duration", "20")
    for name in flags:  # recorded as unset, so the teardown removes what export_flags writes
        monkeypatch.setenv(variable_of(name), "")
    export_flags(flags)
    loaded = mcr.ManagerSettings.load()
    assert (loaded.leader_election, loaded.leader_election_id, loaded.lease_duration) == (
        True,
        "job-fanout",
        20.0,
    )


def test_each_registered_command_is_named_after_its_module_and_run_comes_first() -> None:
    names = [command.name for command in commands()]
    assert names == [module.rpartition(".")[2] for module in COMMAND_MODULES]
    assert names[0] == "run"


def test_a_manager_that_watches_something_passes_the_check() -> None:
    manager = mcr.Manager.from_settings(
        mcr.StaticProvider(), settings=mcr.ManagerSettings.load(leader_election=False, sharding=False)
    )
    mcr.controller_managed_by(manager).named("configmaps").for_(
        CONFIGMAP, clusters=mcr.EVERY_CLUSTER
    ).complete(_noop)
    assert problems(manager, {}) == []
    assert describe(manager) == [
        "provider: StaticProvider",
        "controller configmaps: watches ConfigMap (v1) in every cluster",
        "metrics: :8080",
        "probes: :8081",
    ]


async def _accept(_request: mcr.AdmissionRequest) -> None:
    return None


def test_the_check_names_the_webhook_server_and_what_it_serves() -> None:
    widget = mcr.Kind("example.com/v1", "Widget")
    manager = mcr.Manager(mcr.StaticProvider())
    mcr.controller_managed_by(manager).for_(widget).complete(_noop)
    assert not any(line.startswith("webhooks:") for line in describe(manager))
    mcr.webhook_managed_by(manager).for_(widget).with_validator(_accept).complete()
    assert describe(manager)[-1] == "webhooks: 127.0.0.1:9443: validates Widget (example.com/v1)"


def test_an_argparse_error_is_one_line_naming_the_flag(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["run", "pkg:factory", "--log-format", "xml"])
    assert exited.value.code == 2
    assert capsys.readouterr().err.splitlines() == [
        "mcruntime run: error: argument --log-format: invalid choice: 'xml' (choose from 'text', 'json') "
        "(see mcruntime run --help)"
    ]


@pytest.mark.parametrize(
    ("argv", "error"),
    [
        # The mistyped flag's value would otherwise be taken for the target, and
        # argparse would name the flag and the real target together.
        (
            ["run", "--helth-probe-bind-address", ":8081", "pkg:factory"],
            "unknown flag --helth-probe-bind-address (did you mean --health-probe-bind-address?)",
        ),
        (["run", "pkg:factory", "--log-formt=json"], "unknown flag --log-formt (did you mean --log-format?)"),
        (
            ["run", "pkg:factory", "--no-webhook-http3"],
            "unknown flag --no-webhook-http3 (did you mean --no-webhook-http2?)",
        ),
        (["run", "pkg:factory", "--zzzz"], "unknown flag --zzzz"),
        (["run", "pkg:factory", "other:factory"], "unexpected argument: other:factory"),
    ],
)
def test_an_unknown_flag_is_named_alone_with_the_nearest_known_one(
    argv: list[str], error: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
    assert capsys.readouterr().err.splitlines() == [
        f"mcruntime run: error: {error} (see mcruntime run --help)"
    ]


def test_the_readme_lists_every_setting_as_its_variable() -> None:
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    rows = set(re.findall(r"^\| `(MCRUNTIME_[A-Z0-9_]+)` \|", readme, re.MULTILINE))
    assert rows == {variable_of(name) for name in mcr.ManagerSettings.model_fields}


def test_a_controller_without_sources_fails_the_check() -> None:
    manager = mcr.Manager(mcr.StaticProvider())
    manager.add(mcr.Controller("idle", _noop))
    assert problems(manager, {}) == ["controller 'idle' has no source: nothing would ever be reconciled"]


def test_flags_a_factory_ignored_fail_the_check() -> None:
    manager = mcr.Manager(mcr.StaticProvider())
    mcr.controller_managed_by(manager).for_(CONFIGMAP).complete(_noop)
    assert problems(manager, {"leader_election": True}) == [
        "--leader-election given, but the factory built its Manager without settings: "
        "have it build Manager.from_settings(provider, settings=settings), taking the parsed settings as a 'settings' parameter (or reading MCRUNTIME_* itself with no argument)"
    ]
