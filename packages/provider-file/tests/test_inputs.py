"""Inputs, file discovery and naming, without a cluster: the rules that decide what is read.

These run against a temporary directory only; what the provider does with
what it finds is covered on real control planes in ``test_file_provider.py``.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

import mcruntime as mcr
from mcruntime_file import DEFAULT_INCLUDE, KubeconfigFileProvider, split_path_list
from mcruntime_file._naming import context_filter, naming_function
from mcruntime_file._reader import RACY_SECONDS, FileReader
from mcruntime_file._scan import Found, find_files, read_file

KUBECONFIG = {
    "apiVersion": "v1",
    "kind": "Config",
    "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:6443"}}],
    "users": [{"name": "u", "user": {"token": "not-a-real-token"}}],
    "contexts": [
        {"name": "one", "context": {"cluster": "c", "user": "u"}},
        {"name": "two", "context": {"cluster": "c", "user": "u"}},
    ],
    "current-context": "two",
}


def test_a_directory_is_searched_by_glob_and_dot_entries_are_skipped(tmp_path: Path) -> None:
    for name in ("a.kubeconfig", "config", "notes.txt", ".hidden.kubeconfig", "z.yaml"):
        (tmp_path / name).write_text("x")
    (tmp_path / "..2026_11_21_10_00_00.1").mkdir()
    (tmp_path / "..2026_11_21_10_00_00.1" / "config").write_text("x")
    (tmp_path / "..data").symlink_to("..2026_11_21_10_00_00.1")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.kubeconfig").write_text("x")
    flat = find_files([tmp_path], DEFAULT_INCLUDE, recursive=False)
    assert [found.path.name for found in flat.files] == ["a.kubeconfig", "config", "z.yaml"]
    assert tmp_path in flat.watch and not flat.watch_recursive
    deep = find_files([tmp_path], ["*.kubeconfig"], recursive=True)
    assert [found.path for found in deep.files] == [
        tmp_path / "a.kubeconfig",
        tmp_path / "sub" / "b.kubeconfig",
    ]
    assert deep.watch_recursive == frozenset({tmp_path})


def test_a_rescan_reuses_what_the_last_pass_found_and_forgets_what_went(tmp_path: Path) -> None:
    for name in ("a.kubeconfig", "b.kubeconfig"):
        (tmp_path / name).write_text("x")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "c.kubeconfig").write_text("x")
    reuse: dict[str, Found] = {}
    first = find_files([tmp_path], ["*.kubeconfig"], True, reuse)
    assert set(reuse) == {str(found.path) for found in first.files}
    (tmp_path / "b.kubeconfig").unlink()
    (tmp_path / "d.kubeconfig").write_text("x")
    second = find_files([tmp_path], ["*.kubeconfig"], True, reuse)
    assert second == find_files([tmp_path], ["*.kubeconfig"], True)  # reuse changes nothing seen
    kept = {found.path.name: found for found in first.files}
    for found in second.files:
        if found.path.name in kept:
            assert found is kept[found.path.name]  # the same object: neither built nor hashed again
    assert sorted(Path(path).name for path in reuse) == ["a.kubeconfig", "c.kubeconfig", "d.kubeconfig"]


def test_recursion_survives_a_symlink_loop_and_reports_it(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "loop").symlink_to(tmp_path)
    (tmp_path / "sub" / "c.kubeconfig").write_text("x")
    layout = find_files([tmp_path], ["*.kubeconfig"], recursive=True)
    assert [found.path for found in layout.files] == [tmp_path / "sub" / "c.kubeconfig"]
    loop = tmp_path / "sub" / "loop"
    assert layout.problems == (
        (loop, f"{loop}: a symlink loop (leads back to {tmp_path}); not searched again"),
    )


def test_symlinks_that_loop_among_themselves_are_reported_not_skipped_silently(tmp_path: Path) -> None:
    (tmp_path / "a.kubeconfig").symlink_to(tmp_path / "b.kubeconfig")
    (tmp_path / "b.kubeconfig").symlink_to(tmp_path / "a.kubeconfig")
    (tmp_path / "unrelated").symlink_to(tmp_path / "unrelated")  # matches no glob: not our business
    layout = find_files([tmp_path], ["*.kubeconfig"], recursive=False)
    assert layout.files == ()
    assert [(path.name, message) for path, message in layout.problems] == [
        (name, f"{tmp_path / name}: a symlink loop (too many levels of links); skipped")
        for name in ("a.kubeconfig", "b.kubeconfig")
    ]


def as_unprivileged(work: Callable[[], list[list[str]]]) -> list[list[str]]:
    """``work()`` as it runs for a user without privileges: as is, or, for root, in a child as ``nobody``.

    Root lists a directory whatever its permissions say, and CI runs as root;
    a forked child that gives up root (the modules are already imported, so
    it reads nothing from root's home) sees the permissions as a user does.
    """
    if os.geteuid() != 0:
        return work()
    nobody = pwd.getpwnam("nobody")
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: drop root for good, do the work, report it as JSON, exit at once
        code = 1
        try:
            os.close(read)
            os.setgroups([])
            os.setgid(nobody.pw_gid)
            os.setuid(nobody.pw_uid)
            with os.fdopen(write, "w") as out:
                json.dump(work(), out)
            code = 0
        finally:
            os._exit(code)
    os.close(write)
    with os.fdopen(read) as answer:
        reported = answer.read()
    _pid, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, "the unprivileged child failed"
    result: list[list[str]] = json.loads(reported)
    return result


def test_an_unreadable_directory_is_reported() -> None:
    """Run for real whoever runs the suite (as ``nobody`` when that is root, as in CI)."""
    base = Path(tempfile.mkdtemp(prefix="mcruntime-unreadable-"))
    try:
        base.chmod(0o755)  # nobody must reach the directory to be refused its listing
        closed = base / "closed"
        closed.mkdir()
        closed.chmod(0)

        def problems() -> list[list[str]]:
            layout = find_files([closed], DEFAULT_INCLUDE, recursive=False)
            return [[str(path), message] for path, message in layout.problems]

        assert as_unprivileged(problems) == [
            [str(closed), f"{closed}: cannot list the directory: Permission denied"]
        ]
    finally:
        (base / "closed").chmod(0o755)
        shutil.rmtree(base)


def test_a_missing_path_is_a_file_watched_from_its_nearest_existing_directory(tmp_path: Path) -> None:
    missing = tmp_path / "not" / "yet" / "config"
    layout = find_files([missing, tmp_path / "config"], DEFAULT_INCLUDE, recursive=False)
    assert [(found.path, found.explicit) for found in layout.files] == [
        (missing, True),
        (tmp_path / "config", True),
    ]
    assert layout.watch == frozenset({tmp_path})


def test_a_file_listed_twice_is_read_once_at_its_first_position(tmp_path: Path) -> None:
    (tmp_path / "a.kubeconfig").write_text("x")
    layout = find_files([tmp_path / "a.kubeconfig", tmp_path], DEFAULT_INCLUDE, recursive=False)
    assert [(found.path.name, found.explicit) for found in layout.files] == [("a.kubeconfig", True)]


def test_path_lists_split_like_kubeconfig() -> None:
    assert split_path_list(f"/a{os.pathsep}{os.pathsep}relative") == [Path("/a"), Path.cwd() / "relative"]
    provider = KubeconfigFileProvider(f"/a{os.pathsep}/b")
    assert provider.inputs == (Path("/a"), Path("/b"))
    assert KubeconfigFileProvider([Path("/a:b")]).inputs == (Path("/a:b"),)  # a list is taken as is
    with pytest.raises(ValueError, match="empty"):
        KubeconfigFileProvider(os.pathsep)


def test_no_paths_means_kubeconfig_then_home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert KubeconfigFileProvider().inputs == (tmp_path / ".kube" / "config",)
    monkeypatch.setenv("KUBECONFIG", f"{tmp_path}/x{os.pathsep}{tmp_path}/y")
    assert KubeconfigFileProvider().inputs == (tmp_path / "x", tmp_path / "y")


def test_naming_strategies() -> None:
    path = Path("/etc/fleet/east.kubeconfig")
    assert naming_function("file/context")(path, "admin") == "/etc/fleet/east.kubeconfig/admin"
    assert naming_function("context")(path, "admin") == "admin"
    mapped = naming_function({"admin": "east", "/etc/fleet/east.kubeconfig/ops": "east-ops"})
    assert (mapped(path, "admin"), mapped(path, "ops"), mapped(path, "other")) == ("east", "east-ops", None)
    assert naming_function(lambda p, c: f"{p.stem}-{c}")(path, "x") == "east-x"
    with pytest.raises(ValueError, match="unknown naming strategy"):
        naming_function("stem")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="non-empty"):
        naming_function({"admin": ""})


def test_context_selection() -> None:
    assert context_filter("all")(["a", "b"], "b") == ["a", "b"]
    assert context_filter("current")(["a", "b"], "b") == ["b"]
    assert context_filter("current")(["a"], None) == []
    assert context_filter({"b", "zz"})(["a", "b"], None) == ["b"]
    with pytest.raises(ValueError, match="unknown context selection"):
        context_filter("first")


def test_reading_reports_without_quoting(tmp_path: Path) -> None:
    untrusted = mcr.TrustPolicy.untrusted()
    path = tmp_path / "a.kubeconfig"
    path.write_text("clusters: [\n  token: not-a-real-token\n")
    broken = read_file(Found(path, explicit=True), context_filter("all"), untrusted)
    assert broken.error == f"{path}: not valid YAML at line 3" and broken.contexts is None
    assert "not-a-real-token" not in repr(broken)
    path.write_text(yaml.safe_dump(KUBECONFIG))
    good = read_file(Found(path, explicit=True), context_filter("current"), untrusted)
    assert good.error is None and good.contexts is not None
    assert [(item.context, item.config is not None) for item in good.contexts] == [("two", True)]
    (tmp_path / "other.yaml").write_text(yaml.safe_dump({"kind": "Deployment"}))
    other = read_file(Found(tmp_path / "other.yaml", explicit=False), context_filter("all"), untrusted)
    assert other.ignored and other.error is None  # a YAML that is not a kubeconfig, found in a directory
    gone = read_file(Found(tmp_path / "missing", explicit=True), context_filter("all"), untrusted)
    assert not gone.exists


def _settle(path: Path) -> None:
    """Age a file's mtime past the racy window, as if it was written a while ago."""
    old = time.time() - 10 * RACY_SECONDS
    os.utime(path, (old, old))


def test_an_unchanged_file_is_not_read_again_and_a_changed_one_is(tmp_path: Path) -> None:
    path = tmp_path / "a.kubeconfig"
    path.write_text(yaml.safe_dump(KUBECONFIG))
    _settle(path)
    reader = FileReader(context_filter("all"), mcr.TrustPolicy.untrusted())
    found = Found(path, explicit=True)
    first = reader.read(found)
    assert first.contexts is not None and reader.reads == 1 and reader.parses == 1
    for _pass in range(3):
        assert reader.read(found) is first
    assert reader.reads == 1  # the stamp did not move: not even opened
    changed = dict(KUBECONFIG, **{"current-context": "one"})
    path.write_text(yaml.safe_dump(changed))  # same inode, new size and mtime
    second = reader.read(found)
    assert second is not first and second.digest != first.digest and reader.reads == 2


def test_a_fresh_stamp_is_not_trusted_so_a_same_size_rewrite_within_one_tick_is_seen(tmp_path: Path) -> None:
    path = tmp_path / "a.kubeconfig"
    one = yaml.safe_dump(dict(KUBECONFIG, **{"current-context": "one"}))
    two = yaml.safe_dump(dict(KUBECONFIG, **{"current-context": "two"}))
    assert len(one) == len(two)
    path.write_text(one)
    reader = FileReader(context_filter("current"), mcr.TrustPolicy.untrusted())
    found = Found(path, explicit=True)
    first = reader.read(found)
    stamp = os.stat(path)
    path.write_text(two)
    os.utime(path, ns=(stamp.st_atime_ns, stamp.st_mtime_ns))  # the worst case: the very same mtime
    second = reader.read(found)  # the first stamp was too young to be trusted: read again
    assert [item.context for item in first.contexts or ()] == ["one"]
    assert [item.context for item in second.contexts or ()] == ["two"]


def test_a_file_over_the_limit_is_refused_from_its_size_without_being_read(tmp_path: Path) -> None:
    path = tmp_path / "huge.kubeconfig"
    with path.open("wb") as handle:
        handle.truncate(50 * 1024 * 1024)  # 50 MB (sparse: cheap to make, not to read)
    reader = FileReader(context_filter("all"), mcr.TrustPolicy.untrusted(), max_bytes=1024 * 1024)
    reading = reader.read(Found(path, explicit=False))
    assert reading.error == (
        f"{path}: the file is {50 * 1024 * 1024} bytes, more than the limit of {1024 * 1024} bytes; not read"
    )
    assert reading.contexts is None and reader.reads == 0
    assert read_file(
        Found(path, explicit=True), context_filter("all"), mcr.TrustPolicy.untrusted(), max_bytes=10
    ).error


def test_current_selection_without_current_context_is_reported(tmp_path: Path) -> None:
    path = tmp_path / "a.kubeconfig"
    path.write_text(
        yaml.safe_dump({key: value for key, value in KUBECONFIG.items() if key != "current-context"})
    )
    reading = read_file(Found(path, explicit=True), context_filter("current"), mcr.TrustPolicy.untrusted())
    assert reading.error == f"{path}: sets no current-context, and only the current context is selected"
    assert reading.contexts is None  # a file-level problem: engaged contexts keep their last good config


def test_a_document_cut_short_is_incomplete_not_a_removal(tmp_path: Path) -> None:
    path = tmp_path / "a.kubeconfig"
    text = yaml.safe_dump(KUBECONFIG)
    untrusted = mcr.TrustPolicy.untrusted()
    cuts = {
        text[: text.index("contexts:")]: "no 'contexts', 'users'",
        text[: text.index("  name: two")] + "users: []\n": "contexts[1] has no name or no context",
    }
    for cut, why in cuts.items():
        path.write_text(cut)
        reading = read_file(Found(path, explicit=True), context_filter("all"), untrusted)
        assert reading.contexts is None, cut
        assert reading.error == (
            f"{path}: an incomplete kubeconfig ({why}); nothing is removed until it is whole"
        )
    (tmp_path / "values.yaml").write_text("replicas: 3\n")  # some other YAML in a searched directory
    other = read_file(Found(tmp_path / "values.yaml", explicit=False), context_filter("all"), untrusted)
    assert other.ignored and other.error is None


def test_bad_timings_are_refused() -> None:
    with pytest.raises(ValueError, match="rescan_interval > 0"):
        KubeconfigFileProvider("/a", rescan_interval=0)
