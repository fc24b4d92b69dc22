"""What a watched directory may hold that no kubeconfig writer makes: FIFOs, devices, deep trees, odd names.

Each used to stop or fool the provider: a FIFO blocked a pass (and the
process's exit) forever, a kubeconfig replaced by one was taken as deleted,
a tree 600 levels deep failed every pass with a ``RecursionError``, a file
of N contexts cost N² work, and names from files reached log lines raw.
Everything here runs on real files in ``tmp_path``, without a cluster.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from file_helpers import provider_for, running

import mcruntime as mcr
from mcruntime.testing import wait_until
from mcruntime_file import DEFAULT_INCLUDE
from mcruntime_file._contexts import ContextReading, attempt, build_contexts, reading
from mcruntime_file._naming import context_filter
from mcruntime_file._reader import FileReader
from mcruntime_file._scan import MAX_DIRECTORY_DEPTH, Found, find_files, read_file, read_regular
from mcruntime_file._status import printable

UNTRUSTED = mcr.TrustPolicy.untrusted()
DEAD_SERVER = "https://127.0.0.1:9"  # nothing listens: clusters engage, then stay unhealthy


def one_context(name: str = "a", server: str = DEAD_SERVER) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": f"{name}-cluster", "cluster": {"server": server}}],
        "users": [{"name": f"{name}-user", "user": {"token": "not-a-real-token"}}],
        "contexts": [{"name": name, "context": {"cluster": f"{name}-cluster", "user": f"{name}-user"}}],
        "current-context": name,
    }


def dump(document: dict[str, Any]) -> bytes:
    return yaml.safe_dump(document).encode()


def unblocked(fifo: Path, work: Callable[[], Any]) -> Any:
    """``work()``, which must not block on ``fifo``; fails (and frees the worker) if it still does after 10 s."""
    outcome: list[Any] = []
    worker = threading.Thread(target=lambda: outcome.append(work()), daemon=True)
    worker.start()
    worker.join(10)
    if worker.is_alive():
        release(fifo)
        worker.join(10)
        pytest.fail(f"reading {fifo} blocked until a writer opened it")
    return outcome[0]


def release(fifo: Path) -> None:
    """Let a reader blocked opening ``fifo`` go on: a writer comes and goes (nothing if none waits)."""
    with contextlib.suppress(OSError):  # ENXIO: no reader has it open, none is stuck
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))


# --- FIFOs and devices ----------------------------------------------------------------------


def test_a_fifo_is_refused_by_kind_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "config"
    os.mkfifo(fifo)
    message = f"{fifo}: is a FIFO, not a kubeconfig file"
    reader = FileReader(context_filter("all"), UNTRUSTED)
    assert unblocked(fifo, lambda: reader.read(Found(fifo, explicit=True))).error == message
    assert (
        unblocked(fifo, lambda: read_file(Found(fifo, True), context_filter("all"), UNTRUSTED)).error
        == message
    )
    # What was opened counts, not an earlier stat: the name may have been replaced in between.
    refused = unblocked(fifo, lambda: read_regular(fifo, 1024))
    assert not isinstance(refused, bytes) and refused.error == message and refused.contexts is None
    assert reader.reads == 0


def test_a_device_is_refused_by_kind_and_never_read(tmp_path: Path) -> None:
    zero = tmp_path / "zero.kubeconfig"
    zero.symlink_to("/dev/zero")  # endless: read it and the pass reads until the limit, every time
    reader = FileReader(context_filter("all"), UNTRUSTED)
    first = reader.read(Found(zero, explicit=False))
    assert first.error == f"{zero}: is a character device, not a kubeconfig file"
    assert reader.read(Found(zero, explicit=False)) is first  # unchanged: the same refusal, nothing to act on
    assert reader.reads == 0
    (tmp_path / "dir.kubeconfig").mkdir()
    assert reader.read(Found(tmp_path / "dir.kubeconfig", explicit=True)).error == (
        f"{tmp_path / 'dir.kubeconfig'}: is a directory, not a kubeconfig file"
    )


def test_a_kubeconfig_name_that_is_no_regular_file_is_found_to_be_refused(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "fifo.kubeconfig")
    (tmp_path / "dir.kubeconfig").mkdir()
    (tmp_path / "zero.kubeconfig").symlink_to("/dev/zero")
    (tmp_path / "dangling.kubeconfig").symlink_to(tmp_path / "nowhere")  # gone, as a deleted file is
    os.mkfifo(tmp_path / "pipe")  # matches no glob: not ours to report
    (tmp_path / "ok.kubeconfig").write_bytes(dump(one_context()))
    flat = find_files([tmp_path], ["*.kubeconfig"], recursive=False)
    assert [found.path.name for found in flat.files] == [
        "dir.kubeconfig",
        "fifo.kubeconfig",
        "ok.kubeconfig",
        "zero.kubeconfig",
    ]
    deep = find_files([tmp_path], ["*.kubeconfig"], recursive=True)  # there, directories are searched
    assert [found.path.name for found in deep.files] == [
        "fifo.kubeconfig",
        "ok.kubeconfig",
        "zero.kubeconfig",
    ]


@pytest.mark.parametrize(
    ("kind", "replace"),
    [
        ("a FIFO", lambda path: os.mkfifo(path)),
        ("a directory", lambda path: path.mkdir()),
        ("a character device", lambda path: path.symlink_to("/dev/zero")),
    ],
)
async def test_a_kubeconfig_replaced_by_no_regular_file_keeps_its_cluster_and_says_why(
    tmp_path: Path, kind: str, replace: Callable[[Path], None]
) -> None:
    path = tmp_path / "east.kubeconfig"
    path.write_bytes(dump(one_context("east")))
    (tmp_path / "west.kubeconfig").write_bytes(dump(one_context("west")))
    provider = provider_for(tmp_path, removal_delay=0.0)  # a file taken as deleted would go at once
    name = f"{path}/east"
    async with running(provider):
        await wait_until(lambda: len(provider.clusters.names()) == 2, what="both clusters engaged")
        cluster = await provider.get(name)
        path.unlink()
        replace(path)
        message = f"{path}: is {kind}, not a kubeconfig file"
        try:
            await wait_until(lambda: provider.sources()[str(path)].error == message, what=f"{path} refused")
            passes = provider.passes
            provider.rescan()
            await wait_until(lambda: provider.passes > passes, what="another pass")
        finally:
            if kind == "a FIFO":
                release(path)
        assert await provider.get(name) is cluster  # its last good config, kept
        assert provider.sources()[f"{path}#east"].stale


async def test_a_listed_fifo_neither_blocks_discovery_nor_the_exit(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo.kubeconfig"
    os.mkfifo(fifo)
    good = tmp_path / "good.kubeconfig"
    good.write_bytes(dump(one_context()))
    provider = provider_for(f"{fifo}{os.pathsep}{good}")
    try:
        async with running(provider):
            await wait_until(
                lambda: str(fifo) in provider.sources(), what="a pass reported"
            )  # after its sync
            assert f"{good}/a" in provider.clusters.names()
            assert provider.sources()[str(fifo)].error == f"{fifo}: is a FIFO, not a kubeconfig file"
    finally:  # before the fix, a worker thread sat in open() and the test run could never exit
        release(fifo)


# --- deep trees ---------------------------------------------------------------------------------


def test_a_deep_tree_is_cut_at_the_depth_limit_and_reported_while_the_rest_is_found(tmp_path: Path) -> None:
    (tmp_path / "good.kubeconfig").write_bytes(dump(one_context()))
    os.makedirs(os.path.join(tmp_path, "z", *(["d"] * 600)))  # past Python's recursion limit
    (tmp_path / "z" / "d" / "near.kubeconfig").write_bytes(dump(one_context()))
    layout = find_files([tmp_path], DEFAULT_INCLUDE, recursive=True)
    assert [found.path for found in layout.files] == [
        tmp_path / "good.kubeconfig",
        tmp_path / "z" / "d" / "near.kubeconfig",
    ]
    cut = tmp_path.joinpath("z", *(["d"] * MAX_DIRECTORY_DEPTH))  # the first directory not searched
    assert layout.problems == (
        (cut, f"{cut}: more than {MAX_DIRECTORY_DEPTH} directory levels below {tmp_path}; not searched"),
    )
    within = tmp_path.joinpath("z", *(["d"] * (MAX_DIRECTORY_DEPTH - 1)))  # the deepest one searched
    (within / "deepest.kubeconfig").write_bytes(dump(one_context()))
    assert [found.path for found in find_files([tmp_path], DEFAULT_INCLUDE, recursive=True).files] == [
        tmp_path / "good.kubeconfig",
        within / "deepest.kubeconfig",  # depth first, in name order: "d" before "near.kubeconfig"
        tmp_path / "z" / "d" / "near.kubeconfig",
    ]


async def test_a_deep_tree_does_not_stop_discovery(tmp_path: Path) -> None:
    good = tmp_path / "good.kubeconfig"
    good.write_bytes(dump(one_context()))
    os.makedirs(os.path.join(tmp_path, "z", *(["d"] * 600)))
    provider = provider_for(tmp_path, recursive=True)
    async with running(provider):
        await wait_until(lambda: str(good) in provider.sources(), what="a pass reported")  # after its sync
        assert f"{good}/a" in provider.clusters.names() and provider.failed_passes == 0
        assert [error for error in (s.error for s in provider.sources().values()) if error] == [
            f"{tmp_path.joinpath('z', *(['d'] * MAX_DIRECTORY_DEPTH))}: more than {MAX_DIRECTORY_DEPTH} "
            f"directory levels below {tmp_path}; not searched"
        ]


# --- many contexts in one file ---------------------------------------------------------------


def many_contexts(count: int) -> dict[str, Any]:
    document: dict[str, Any] = {"kind": "Config", "clusters": [], "users": [], "contexts": []}
    for index in range(count):
        document["clusters"].append(
            {"name": f"c{index}", "cluster": {"server": f"https://10.0.0.{index % 250}"}}
        )
        document["users"].append({"name": f"u{index}", "user": {"token": f"token-{index}"}})
        document["contexts"].append(
            {"name": f"x{index}", "context": {"cluster": f"c{index}", "user": f"u{index}"}}
        )
    return document


@pytest.fixture
def entries_seen(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The entries (clusters, users and contexts) of each document handed to ``kubeconfig_from_dict``."""
    seen: list[int] = []
    build = mcr.kubeconfig_from_dict

    def counting(data: Any, *args: Any, **kwargs: Any) -> mcr.ClusterConfig:
        seen.append(sum(len(data.get(key) or ()) for key in ("clusters", "users", "contexts")))
        return build(data, *args, **kwargs)

    monkeypatch.setattr(mcr, "kubeconfig_from_dict", counting)
    return seen


@pytest.mark.parametrize("count", [200, 800])
def test_the_work_of_a_file_grows_linearly_with_its_contexts(
    tmp_path: Path, count: int, entries_seen: list[int]
) -> None:
    path = tmp_path / "fleet.kubeconfig"
    path.write_bytes(dump(many_contexts(count)))
    result = read_file(Found(path, explicit=True), context_filter("all"), UNTRUSTED)
    assert result.contexts is not None and all(item.config is not None for item in result.contexts)
    assert len(entries_seen) == count  # one build per context
    assert entries_seen[0] == 3 * count  # the whole document once, for its checks
    assert max(entries_seen[1:]) == 3  # then each context from its own three entries
    assert sum(entries_seen) <= 6 * count  # 3N + 3(N-1), where it was N times 3N


def summary(readings: tuple[ContextReading, ...]) -> list[tuple[Any, ...]]:
    """What a reading says, comparable: configs by content, not identity."""
    return [
        (
            item.context,
            item.error,
            None
            if item.config is None
            else (
                item.config.fingerprint(),
                item.config.origin,
                item.config.context,
                item.config.cluster_name,
                item.config.user_name,
                dict(item.config.cluster),
                dict(item.config.user),
            ),
        )
        for item in readings
    ]


def whole_each_time(data: dict[str, Any], path: Path, chosen: list[str]) -> tuple[ContextReading, ...]:
    """The old way: the whole document built once per context."""
    return tuple(reading(context, attempt(data, path, context, UNTRUSTED), path) for context in chosen)


def broken_entries() -> dict[str, Any]:
    """Every kind of broken context beside good ones, and duplicate names (the first one wins)."""
    document = many_contexts(3)
    document["clusters"] += [
        {"name": "c0", "cluster": {"server": "https://second.example"}},  # a duplicate: ignored
        {"name": "plain", "cluster": {"server": "http://10.0.0.9"}},
        {"name": "empty", "cluster": None},
    ]
    document["users"] += [
        {
            "name": "plugin",
            "user": {"exec": {"apiVersion": "client.authentication.k8s.io/v1", "command": "x"}},
        },
        {"name": "echoed", "user": {"token": "abc\n"}},
        {"name": "relative", "user": {"tokenFile": "token"}},
    ]
    document["contexts"] += [
        {"name": "x1", "context": {"cluster": "plain", "user": "u1"}},  # a duplicate: ignored
        {"name": "dangling", "context": {"cluster": "nowhere", "user": "u0"}},
        {"name": "userless", "context": {"cluster": "c0", "user": "nobody"}},
        {"name": "clusterless", "context": {"user": "u0"}},
        {"name": "http", "context": {"cluster": "plain"}},
        {"name": "nulled", "context": {"cluster": "empty"}},
        {"name": "exec", "context": {"cluster": "c0", "user": "plugin"}},
        {"name": "echo", "context": {"cluster": "c0", "user": "echoed"}},
        {"name": "file", "context": {"cluster": "c0", "user": "relative"}},
        {"name": "odd-user", "context": {"cluster": "c0", "user": ["not", "a", "name"]}},
        {"name": "", "context": {"cluster": "c2", "user": "u2"}},  # "": the core builds the current one
    ]
    document["current-context"] = "x0"
    return document


def whole_file_problems() -> dict[str, dict[str, Any]]:
    """Documents whose problem is the whole file's: every context gets the same error."""
    changes: dict[str, Callable[[dict[str, Any]], object]] = {
        "clusters not a list": lambda d: d.update(clusters={"c0": {}}),
        "a cluster without a name": lambda d: d["clusters"].append({"cluster": {"server": "https://x"}}),
        "a user that is no mapping": lambda d: d["users"].append({"name": "bad", "user": "text"}),
        "an unnamed context at the end": lambda d: d["contexts"].append({"context": {}}),
        "over the core's size": lambda d: d["users"].append(
            {"name": "big", "user": {"token": "t" * (1 << 20)}}
        ),
    }
    problems = {}
    for name, change in changes.items():
        document = many_contexts(4)
        change(document)
        problems[name] = document
    return problems


@pytest.mark.parametrize(
    "name", ["broken entries", *whole_file_problems()], ids=lambda name: name.replace(" ", "-")
)
def test_each_context_gets_what_a_whole_document_build_gives_it(tmp_path: Path, name: str) -> None:
    data = broken_entries() if name == "broken entries" else whole_file_problems()[name]
    (tmp_path / "token").write_text("a-token")
    path = tmp_path / "fleet.kubeconfig"
    chosen = list(
        dict.fromkeys(item["name"] for item in data["contexts"] if isinstance(item.get("name"), str))
    )
    for selection in (chosen, chosen[::-1], ["missing", *chosen]):
        built = build_contexts(data, path, selection, UNTRUSTED)
        assert summary(built) == summary(whole_each_time(data, path, selection))
    errors = {item.error for item in build_contexts(data, path, chosen, UNTRUSTED)}
    if name == "broken entries":
        assert len(errors - {None}) == 8  # one message per broken context
    else:
        (error,) = errors  # one message for all, naming the file and no context
        assert error is not None and error.startswith(f"{path}: ")


def test_a_current_context_that_is_missing_is_reported_as_before(tmp_path: Path) -> None:
    data = broken_entries()
    path = tmp_path / "fleet.kubeconfig"
    (missing,) = build_contexts(data, path, ["gone"], UNTRUSTED)
    assert missing.error is not None and missing.error.startswith(f"{path}: context 'gone' not found")


# --- files a kubeconfig names -------------------------------------------------------------------


async def test_a_file_named_outside_the_directory_is_refused_alike_whether_or_not_it_exists(
    tmp_path: Path,
) -> None:
    """The trust policy decides first: the status must not tell which of the controller's files exist."""
    fleet, controller = tmp_path / "fleet", tmp_path / "controller"
    fleet.mkdir()
    controller.mkdir()
    (controller / "token").write_text("the-controllers-own-token")
    document = one_context("present")
    document["users"][0]["user"] = {"tokenFile": str(controller / "token")}
    absent = one_context("absent")
    absent["users"][0]["user"] = {"tokenFile": str(controller / "no-such-token")}
    for key in ("clusters", "users", "contexts"):
        document[key] += absent[key]
    path = fleet / "fleet.kubeconfig"
    path.write_bytes(dump(document))
    provider = provider_for(fleet)
    async with running(provider):

        def errors() -> dict[str, str | None]:
            sources = provider.sources()
            return {
                name: getattr(sources.get(f"{path}#{name}"), "error", None) for name in ("present", "absent")
            }

        await wait_until(lambda: all(errors().values()), what="both contexts refused")
        refused = errors()
    assert provider.clusters.names() == []
    present, absent_error = refused["present"], refused["absent"]
    assert present is not None and absent_error is not None
    assert absent_error.replace("absent", "present").replace("no-such-token", "token") == present, refused
    assert "tokenFile names a file outside this kubeconfig's directory" in present, present
    assert "does not exist" not in absent_error, absent_error


# --- what messages quote ----------------------------------------------------------------------


def test_a_long_kind_is_quoted_cut_short(tmp_path: Path) -> None:
    path = tmp_path / "other.yaml"
    path.write_bytes(dump(dict(one_context(), kind="X" * 200_000)))
    result = read_file(Found(path, explicit=True), context_filter("all"), UNTRUSTED)
    assert result.error == f"{path}: not a kubeconfig (kind '{'X' * 99}...)"  # 100 characters of its repr


def test_printable_escapes_what_would_break_or_paint_a_line() -> None:
    assert printable("/etc/fleet/east.kubeconfig") == "/etc/fleet/east.kubeconfig"
    assert printable("a\nb\x1b[2J\u2028c\udcff") == "a\\nb\\x1b[2J\\u2028c\\udcff"


async def test_names_from_files_reach_logs_and_statuses_escaped(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="mcruntime.providers.file")
    forged = "\x1b[2J\nCRITICAL forged line"
    broken = tmp_path / f"evil{forged}.yaml"
    broken.write_text("kind: Config\nclusters: [\n")
    document = one_context()
    document["clusters"][0]["cluster"]["certificate-authority"] = f"ca{forged}"  # a path field, quoted
    (tmp_path / "ca.kubeconfig").write_bytes(dump(document))
    provider = provider_for(tmp_path)
    async with running(provider):
        await wait_until(
            lambda: len([s for s in provider.sources().values() if s.error]) == 2, what="both problems"
        )
        reported = [s.error for s in provider.sources().values() if s.error]

        def logged() -> list[str]:
            return [r.getMessage() for r in caplog.records if r.name == "mcruntime.providers.file"]

        await wait_until(lambda: len(logged()) >= 2, what="both problems logged")
    for message in [*reported, *logged()]:
        assert message is not None and "\n" not in message and "\x1b" not in message, message
    assert f"{printable(str(broken))}: not valid YAML at line 3" in reported
