"""KubeconfigFileProvider at the edges where file watchers break, on real control planes.

Each test writes kubeconfigs into a temporary directory, runs the provider
with a recording :class:`mcruntime.Aware` (no manager needed: the provider
engages through its ClusterSet), and waits for conditions with deadlines.
Engagement history and cluster object identity tell a re-engagement apart
from a cluster that was left alone.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import os
import shutil
import time
from pathlib import Path
from typing import Any

import pytest
from file_helpers import (
    dump,
    engaged,
    errors,
    gone,
    kubeconfig,
    processed,
    provider_for,
    running,
    state,
    unique,
    uses_token,
    write_atomic,
    write_in_place,
)

import mcruntime as mcr
from mcruntime.testing import Breakage, Fleet, Target, User, wait_until

# --- writers ------------------------------------------------------------------------------


async def test_every_atomic_rename_over_is_seen(tmp_path: Path, fleet: Fleet) -> None:
    """Renaming a new file over the kubeconfig is noticed each time (a per-file watch would go deaf)."""
    path = tmp_path / "east.kubeconfig"
    name = f"{path}/east"
    planes = [fleet["cluster-1"], fleet["cluster-2"], fleet["cluster-3"]]
    write_atomic(path, dump(kubeconfig(("east", planes[0], None))))
    provider = provider_for(tmp_path)
    async with running(provider) as recorder:
        first = await engaged(provider, name, planes[0].server)
        for plane in planes[1:]:
            write_atomic(path, dump(kubeconfig(("east", plane, None))))
            await engaged(provider, name, plane.server)
        assert recorder.count(name) == 3
        assert first.stopped and not (await provider.get(name)).stopped


async def test_a_partial_write_never_disengages(tmp_path: Path, fleet: Fleet) -> None:
    """Emptied, cut mid-way, cut after a context, then completed: the same clusters throughout."""
    path = tmp_path / "fleet.kubeconfig"
    full = dump(kubeconfig(("alpha", fleet["cluster-1"], None), ("beta", fleet["cluster-2"], None)))
    write_atomic(path, full)
    provider = provider_for(tmp_path, removal_delay=60.0)  # a pending removal cannot complete in the test
    alpha, beta = f"{path}/alpha", f"{path}/beta"
    async with running(provider) as recorder:
        before = {alpha: await engaged(provider, alpha), beta: await engaged(provider, beta)}

        write_in_place(path, b"")
        status = await processed(provider, path, b"")
        assert status.error == f"{path}: the file is empty"
        assert all(context.stale and context.engaged for context in status.contexts.values())

        cut = full[: len(full) // 2]
        write_in_place(path, cut)
        await processed(provider, path, cut)

        first_only = dump(kubeconfig(("alpha", fleet["cluster-1"], None)))
        write_in_place(path, first_only)
        status = await processed(provider, path, first_only)
        assert status.removing == ("beta",) and status.error is None

        write_in_place(path, full)
        status = await processed(provider, path, full)
        assert status.removing == () and status.errors() == []
        for name, cluster in before.items():
            assert await provider.get(name) is cluster and not cluster.stopped
            assert recorder.count(name) == 1


# --- Secret volumes and referenced files --------------------------------------------------


def _secret_volume_version(volume: Path, stamp: str, files: dict[str, bytes]) -> Path:
    version = volume / f"..{stamp}"
    version.mkdir()
    for file, content in files.items():
        (version / file).write_bytes(content)
    return version


def _publish(volume: Path, version: Path, files: list[str]) -> None:
    """The kubelet's AtomicWriter: swap ``..data`` by renaming a new symlink over it."""
    staging = volume / "..data_tmp"
    staging.symlink_to(version.name)
    os.replace(staging, volume / "..data")
    for file in files:
        if not (volume / file).is_symlink():
            (volume / file).symlink_to(Path("..data") / file)


async def test_a_secret_volume_rotation_is_seen(tmp_path: Path, fleet: Fleet) -> None:
    """A rotated token behind the ``..data`` swap is used, in place; the relative CA path follows."""
    plane = fleet["cluster-3"]
    before, after = plane.add_token_user(unique("file-before")), plane.add_token_user(unique("file-after"))
    volume = tmp_path / "secret"
    volume.mkdir()

    def files(user: User) -> dict[str, bytes]:
        document = kubeconfig(("fleet", plane, user))
        cluster = document["clusters"][0]["cluster"]
        del cluster["certificate-authority-data"]
        cluster["certificate-authority"] = "ca.crt"  # relative: resolves next to the kubeconfig as seen
        return {"kubeconfig": dump(document), "ca.crt": plane.ca.cert_pem}

    old = _secret_volume_version(volume, "2026_11_21_10_00_00.000000001", files(before))
    _publish(volume, old, ["kubeconfig", "ca.crt"])
    provider = provider_for(volume)
    name = f"{volume}/kubeconfig/fleet"
    async with running(provider) as recorder:
        cluster = await engaged(provider, name)
        await state(provider, name, mcr.ClusterPhase.READY)
        assert await uses_token(cluster, before.token)
        assert cluster.config.cluster["certificate-authority"] == str(volume / "ca.crt")
        assert [s.name for s in provider.sources().values() if s.kind == "kubeconfig file"] == [
            str(volume / "kubeconfig")
        ]  # no ..data, no ..2026_*

        new = _secret_volume_version(volume, "2026_11_21_10_05_00.000000002", files(after))
        _publish(volume, new, ["kubeconfig", "ca.crt"])
        shutil.rmtree(old)
        await wait_until(lambda: uses_token(cluster, after.token), what="the rotated token in use")
        status = await state(provider, name, mcr.ClusterPhase.READY)
        assert await provider.get(name) is cluster and recorder.count(name) == 1
        assert status.credential_rotations == 1
        assert errors(provider) == []


async def test_relative_certificate_paths_and_their_changes(tmp_path: Path, fleet: Fleet) -> None:
    """Relative CA and client-certificate paths resolve next to the file; a rewritten CA is noticed."""
    plane = fleet["cluster-1"]
    admin = plane.kubeconfig()["users"][0]["user"]
    certs = tmp_path / "certs"
    foreign = Target.of(plane, breakage=Breakage.UNTRUSTED_CA).ca_pem
    write_atomic(certs / "ca.crt", foreign)
    write_atomic(certs / "client.crt", base64.b64decode(admin["client-certificate-data"]))
    write_atomic(certs / "client.key", base64.b64decode(admin["client-key-data"]))
    document = kubeconfig(("east", plane, None))
    document["clusters"][0]["cluster"] = {"server": plane.server, "certificate-authority": "certs/ca.crt"}
    document["users"][0]["user"] = {
        "client-certificate": "certs/client.crt",
        "client-key": "certs/client.key",
    }
    path = tmp_path / "east.kubeconfig"
    write_atomic(path, dump(document))
    provider = provider_for(path)
    name = f"{path}/east"
    async with running(provider) as recorder:
        untrusted = await engaged(provider, name)
        assert untrusted.config.cluster["certificate-authority"] == str(certs / "ca.crt")
        assert untrusted.config.user["client-key"] == str(certs / "client.key")
        await state(provider, name, mcr.ClusterPhase.UNHEALTHY)  # a foreign CA is unhealthy, never skipped

        write_atomic(certs / "ca.crt", plane.ca.cert_pem)  # the kubeconfig itself does not change
        await wait_until(lambda: recorder.count(name) == 2, what="re-engaged with the new CA")
        await state(provider, name, mcr.ClusterPhase.READY)
        assert untrusted.stopped


# --- what a file says -----------------------------------------------------------------------


async def test_a_broken_context_fails_only_itself(
    tmp_path: Path, fleet: Fleet, caplog: pytest.LogCaptureFixture
) -> None:
    """One good, one dangling and one exec context in a file: only the good one engages."""
    caplog.set_level(logging.WARNING, logger="mcruntime.providers.file")
    plane = fleet["cluster-1"]
    document = kubeconfig(("good", plane, None), ("dangling", plane, None), ("plugin", plane, None))
    document["contexts"][1]["context"]["cluster"] = "nowhere"
    document["users"][2]["user"] = {"exec": {"apiVersion": "client.authentication.k8s.io/v1", "command": "x"}}
    path = tmp_path / "mixed.kubeconfig"
    write_atomic(path, dump(document))
    provider = provider_for(tmp_path)
    async with running(provider):
        await engaged(provider, f"{path}/good")
        status = await processed(provider, path, dump(document))
        assert provider.clusters.names() == [f"{path}/good"]
        assert status.contexts["good"].engaged and status.contexts["good"].error is None
        assert (
            status.contexts["dangling"].error
            == f"{path}, context 'dangling': cluster entry 'nowhere' not found"
        )
        plugin = status.contexts["plugin"].error
        assert plugin is not None and plugin.startswith(f"{path}, context 'plugin':")
        assert "trust policy refuses" in plugin
        assert errors(provider) == [status.contexts["dangling"].error, plugin]
        statuses = provider.statuses()  # the good one carries its context; the others never engaged
        assert statuses[f"{path}/good"].source == status.contexts["good"]
        dangling = statuses[f"{path}/dangling"]
        assert (
            dangling.phase is mcr.ClusterPhase.FAILED and dangling.error == status.contexts["dangling"].error
        )
        assert caplog.text.count("cluster entry 'nowhere' not found") == 1  # logged once, not per pass
        secret = plane.kubeconfig()["users"][0]["user"]["client-key-data"]
        assert secret not in caplog.text + repr(provider) + repr(provider.sources())


async def test_two_files_with_one_context_name(tmp_path: Path, fleet: Fleet) -> None:
    """By default both engage under distinct names; by context name the first wins and the other is reported."""
    first, second = tmp_path / "a.kubeconfig", tmp_path / "b.kubeconfig"
    write_atomic(first, dump(kubeconfig(("admin", fleet["cluster-1"], None))))
    write_atomic(second, dump(kubeconfig(("admin", fleet["cluster-2"], None))))

    default = provider_for(tmp_path)
    async with running(default):
        await engaged(default, f"{first}/admin", fleet["cluster-1"].server)
        await engaged(default, f"{second}/admin", fleet["cluster-2"].server)
        assert default.clusters.names() == [f"{first}/admin", f"{second}/admin"]

    by_context = provider_for(tmp_path, naming="context")
    async with running(by_context) as recorder:
        holder = await engaged(by_context, "admin", fleet["cluster-1"].server)
        status = await processed(by_context, second, second.read_bytes())
        assert status.contexts["admin"].detail["duplicate_of"] == f"{first}#admin"
        assert not status.contexts["admin"].engaged
        assert errors(by_context) == [
            f"{second}, context 'admin': cluster name 'admin' is already provided by context 'admin' "
            f"of {first}; this context is ignored"
        ]
        first.unlink()  # the holder's file is gone: the other claim takes the name
        await engaged(by_context, "admin", fleet["cluster-2"].server)
        assert holder.stopped and recorder.count("admin") == 2 and errors(by_context) == []


async def test_a_context_removed_from_a_file_disengages_only_that_cluster(
    tmp_path: Path, fleet: Fleet
) -> None:
    path = tmp_path / "fleet.kubeconfig"
    write_atomic(
        path, dump(kubeconfig(("alpha", fleet["cluster-1"], None), ("beta", fleet["cluster-2"], None)))
    )
    provider = provider_for(tmp_path)
    alpha, beta = f"{path}/alpha", f"{path}/beta"
    async with running(provider) as recorder:
        kept, removed = await engaged(provider, alpha), await engaged(provider, beta)
        write_atomic(path, dump(kubeconfig(("alpha", fleet["cluster-1"], None))))
        await gone(provider, beta)
        assert removed.stopped and removed.transport.closed
        assert await provider.get(alpha) is kept and not kept.stopped and recorder.count(alpha) == 1
        with pytest.raises(mcr.ClusterNotFound):
            await provider.get(beta)


async def test_only_the_current_context_or_a_selection(tmp_path: Path, fleet: Fleet) -> None:
    path = tmp_path / "fleet.kubeconfig"
    document = kubeconfig(
        ("alpha", fleet["cluster-1"], None), ("beta", fleet["cluster-2"], None), current="beta"
    )
    write_atomic(path, dump(document))
    current = provider_for(path, contexts="current", naming={"beta": "picked"})
    async with running(current):
        await engaged(current, "picked", fleet["cluster-2"].server)
        document["current-context"] = "alpha"  # switching contexts moves the selection
        write_atomic(path, dump(document))
        await processed(current, path, dump(document))
        await gone(current, "picked")  # alpha is not in the mapping: a mapping selects too
        assert current.clusters.names() == []
    selected = provider_for(path, contexts=["alpha"], naming="context")
    async with running(selected):
        await engaged(selected, "alpha", fleet["cluster-1"].server)
        await processed(selected, path, dump(document))
        assert selected.clusters.names() == ["alpha"]


# --- inputs -------------------------------------------------------------------------------------


async def test_kubeconfig_with_two_paths_one_created_later(
    tmp_path: Path, fleet: Fleet, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With no paths, ``KUBECONFIG`` is read; a listed file in a directory not there yet is engaged once written."""
    one, two = tmp_path / "one.yaml", tmp_path / "later" / "deeper" / "two.yaml"
    write_atomic(one, dump(kubeconfig(("east", fleet["cluster-1"], None))))
    monkeypatch.setenv("KUBECONFIG", f"{one}{os.pathsep}{two}")
    provider = provider_for(None)
    assert provider.inputs == (one, two)
    assert provider_for(os.environ["KUBECONFIG"]).inputs == (one, two)
    async with running(provider):
        await engaged(provider, f"{one}/east", fleet["cluster-1"].server)
        write_atomic(two, dump(kubeconfig(("west", fleet["cluster-2"], None))))
        await engaged(provider, f"{two}/west", fleet["cluster-2"].server)
        two.unlink()  # a deleted file disengages its clusters
        await gone(provider, f"{two}/west")
        assert provider.clusters.names() == [f"{one}/east"]


# --- hostile and broken input ---------------------------------------------------------------


def _age(*paths: Path) -> None:
    """Date files back past the reader's racy window, as if written a while ago."""
    old = time.time() - 60
    for path in paths:
        os.utime(path, (old, old))


async def test_a_rewrite_in_two_steps_keeps_the_same_cluster(tmp_path: Path, fleet: Fleet) -> None:
    """A writer that leaves a cut-short file for two seconds, well past removal_delay, costs nothing."""
    path = tmp_path / "fleet.kubeconfig"
    full = dump(kubeconfig(("alpha", fleet["cluster-1"], None), ("beta", fleet["cluster-2"], None)))
    write_atomic(path, full)
    provider = provider_for(tmp_path, removal_delay=0.5, rescan_interval=0.1)
    alpha, beta = f"{path}/alpha", f"{path}/beta"
    async with running(provider) as recorder:
        before = {alpha: await engaged(provider, alpha), beta: await engaged(provider, beta)}
        first_step = full[: full.index(b"contexts:")]  # valid YAML: clusters only, no contexts, no users
        write_in_place(path, first_step)
        status = await processed(provider, path, first_step)
        assert (
            status.error is not None and "an incomplete kubeconfig (no 'contexts', 'users')" in status.error
        )
        assert all(context.stale and context.engaged for context in status.contexts.values())
        assert status.removing == ()
        loop = asyncio.get_running_loop()
        since, passes = loop.time(), provider.passes
        await wait_until(
            lambda: loop.time() - since >= 2.0 and provider.passes >= passes + 5,
            what="two seconds of passes over the cut-short file",
        )
        assert set(provider.clusters.names()) == {alpha, beta}
        write_in_place(path, full)  # the second step
        status = await processed(provider, path, full)
        assert status.errors() == [] and not any(context.stale for context in status.contexts.values())
        for name, cluster in before.items():
            assert await provider.get(name) is cluster and not cluster.stopped
            assert recorder.count(name) == 1


async def test_current_selection_losing_its_current_context_is_reported_and_kept(
    tmp_path: Path, fleet: Fleet
) -> None:
    path = tmp_path / "config"
    document = kubeconfig(("alpha", fleet["cluster-1"], None), current="alpha")
    write_atomic(path, dump(document))
    provider = provider_for(path, contexts="current", naming="context")
    async with running(provider) as recorder:
        cluster = await engaged(provider, "alpha")
        del document["current-context"]
        write_atomic(path, dump(document))
        status = await processed(provider, path, dump(document))
        assert status.error == f"{path}: sets no current-context, and only the current context is selected"
        assert status.contexts["alpha"].stale and errors(provider) == [status.error]
        assert await provider.get("alpha") is cluster and recorder.count("alpha") == 1


async def test_a_huge_file_is_refused_by_its_size_and_never_slows_a_pass(
    tmp_path: Path, fleet: Fleet
) -> None:
    """A 50 MB file sits in the watched directory: refused unread; new kubeconfigs engage as usual."""
    huge = tmp_path / "dump.yaml"
    with huge.open("wb") as handle:
        handle.truncate(50 * 1024 * 1024)
    first = tmp_path / "first.kubeconfig"
    write_atomic(first, dump(kubeconfig(("first", fleet["cluster-1"], None))))
    _age(huge, first)
    provider = provider_for(tmp_path, rescan_interval=0.1)
    async with running(provider):
        await engaged(provider, f"{first}/first")
        await wait_until(lambda: provider.passes >= 5, what="a few passes")
        limit = provider.max_file_bytes
        assert provider.sources()[str(huge)].error == (
            f"{huge}: the file is {50 * 1024 * 1024} bytes, more than the limit of {limit} bytes; not read"
        )
        assert provider.file_reads == 1  # the aged kubeconfig once; the huge file never
        assert f"{huge}: the file is" in errors(provider)[0]
        second = tmp_path / "second.kubeconfig"
        loop = asyncio.get_running_loop()
        started = loop.time()
        write_atomic(second, dump(kubeconfig(("second", fleet["cluster-2"], None))))
        await engaged(provider, f"{second}/second")
        print(f"engaged beside a 50 MB file in {loop.time() - started:.3f}s")


async def test_five_thousand_failed_passes_are_retried_and_the_loop_recovers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The retry loop's backoff never overflows (the old formula died after ~1,024 failures)."""
    from mcruntime_file import _provider
    from mcruntime_file._scan import find_files

    calls = 0

    def failing(*args: Any) -> Any:
        nonlocal calls
        calls += 1
        if calls <= 5000:
            raise OSError(f"injected failure {calls}")
        return find_files(*args)

    monkeypatch.setattr(_provider, "find_files", failing)
    (tmp_path / "loop.kubeconfig").symlink_to(tmp_path / "loop.kubeconfig")
    provider = provider_for(tmp_path, backoff=mcr.Backoff(base=0.0, cap=0.0))
    async with running(provider):
        await wait_until(lambda: provider.passes >= 1, timeout=60, what="a pass after 5,000 failures")
        assert provider.failed_passes == 5000
        loop = tmp_path / "loop.kubeconfig"  # and the symlink loop it then found is reported
        assert provider.sources()[str(loop)].error == (
            f"{loop}: a symlink loop (too many levels of links); skipped"
        )


async def test_a_rescan_of_unchanged_files_acts_on_nothing(tmp_path: Path, fleet: Fleet) -> None:
    """A rescan of 10,000 files that did not move must not fold, sync and report all of them again."""
    path = tmp_path / "fleet.kubeconfig"
    write_atomic(path, dump(kubeconfig(("alpha", fleet["cluster-1"], None))))
    provider = provider_for(tmp_path)
    folds = [0]
    fold = provider._apply

    def counting(*args: Any) -> float | None:
        folds[0] += 1
        return fold(*args)

    provider._apply = counting  # type: ignore[method-assign,assignment]

    async def rescan_folds() -> int:
        before, passes = folds[0], provider.passes
        provider.rescan()
        await wait_until(lambda: provider.passes > passes, what="the rescan's pass")
        return folds[0] - before

    async with running(provider):
        alpha = await engaged(provider, f"{path}/alpha")

        # Read again until its stamp is old enough to trust (a write in the same instant could hide).
        async def quiet() -> bool:
            return await rescan_folds() == 0

        await wait_until(quiet, what="a rescan that folds nothing")
        assert [await rescan_folds() for _ in range(3)] == [0, 0, 0]
        write_atomic(
            path, dump(kubeconfig(("alpha", fleet["cluster-1"], None), ("beta", fleet["cluster-2"], None)))
        )
        await engaged(provider, f"{path}/beta")
        assert folds[0] > 0 and await provider.get(f"{path}/alpha") is alpha
