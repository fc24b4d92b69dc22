"""The container backend: same clusters, run as containers of a local scratch image, always cleaned up.

These tests need a Docker daemon (CI starts one); without one they are skipped
with the reason, unless ``MCRUNTIME_TESTBED_BACKEND=container`` says the run is
meant for containers, in which case a missing daemon is a failure.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from kube_helpers import new_namespace, running_cluster

import mcruntime as mcr
from mcruntime.testing import Fleet, TestbedError, find_assets
from mcruntime.testing._containers import (
    LABEL,
    OWNER_LABEL,
    ContainerBackend,
    owner_alive,
    process_identity,
    wait_for_removal,
)

NAMESPACE = mcr.Kind("v1", "Namespace")


def _docker_reachable() -> bool:
    if not os.environ.get("DOCKER_HOST") and not os.path.exists("/var/run/docker.sock"):
        return False  # asking docker-py anyway leaks its failed socket (a warning at exit)
    try:
        import docker

        client = docker.from_env()
    except Exception:
        return False
    try:  # closed either way: a client left open warns at exit when no daemon answered
        return bool(client.ping())
    except Exception:
        return False
    finally:
        client.close()


if not _docker_reachable() and os.environ.get("MCRUNTIME_TESTBED_BACKEND") != "container":
    pytest.skip("no Docker daemon answers (CI starts one for these tests)", allow_module_level=True)


@pytest.fixture
def backend() -> Iterator[ContainerBackend]:
    made = ContainerBackend()
    try:
        yield made
    finally:
        made.close()


def _session_containers(backend: ContainerBackend) -> list[object]:
    found = backend.client.containers.list(
        all=True, filters={"label": f"{LABEL}={backend.session}"}, ignore_removed=True
    )
    return list(found)


async def test_a_cluster_in_containers_serves_on_loopback_and_leaves_nothing(
    backend: ContainerBackend, tmp_path: Path
) -> None:
    with Fleet(workdir=tmp_path, backend=backend) as fleet:
        plane = fleet.add("boxed")
        containers = _session_containers(backend)
        assert len(containers) == 2  # etcd and kube-apiserver
        for container in containers:
            attrs = container.attrs  # type: ignore[attr-defined]
            assert attrs["HostConfig"]["NetworkMode"] == "host"
            assert attrs["Config"]["Labels"][OWNER_LABEL] == backend.owner
        async with running_cluster(plane) as cluster:
            namespace = await new_namespace(cluster)
            listed = await cluster.client.list(NAMESPACE)
            assert namespace in {n["metadata"]["name"] for n in listed.items}
        assert plane.rss_bytes() > 0
    assert _session_containers(backend) == []
    # The container's output outlives the container, as a process's log does.
    assert "Serving securely" in (tmp_path / "boxed" / "logs" / "kube-apiserver-primary.log").read_text()


def test_the_image_is_built_from_scratch_with_static_binaries(backend: ContainerBackend) -> None:
    assets = find_assets()
    assert assets is not None
    image, command = backend.image_for([str(assets.etcd), "--version"])
    inspected = backend.client.images.get(image).attrs
    # FROM scratch: one layer per binary copied in, and nothing else.
    assert len(inspected["RootFS"]["Layers"]) == len(backend._binaries)
    assert command == ["/testbed/etcd", "--version"]
    for binary in backend._binaries.values():
        head = binary.read_bytes()[:8192]
        assert b"ld-linux" not in head, f"{binary} is dynamically linked"


def test_containers_of_a_killed_owner_are_removed_by_the_reaper(tmp_path: Path) -> None:
    script = textwrap.dedent(
        f"""
        import time
        from pathlib import Path
        from mcruntime.testing import Fleet
        fleet = Fleet(workdir=Path({str(tmp_path)!r}), backend="container")
        fleet.add("orphan")
        print(fleet.backend.session, flush=True)
        time.sleep(600)
        """
    )
    import docker

    client = docker.from_env()
    with subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True) as child:
        try:
            assert child.stdout is not None
            session = child.stdout.readline().strip()
            assert session, "the child did not start its cluster"
            assert client.containers.list(all=True, filters={"label": f"{LABEL}={session}"})
        finally:
            child.send_signal(signal.SIGKILL)  # no atexit, no finally: only the reaper can clean up
            child.wait()
    assert wait_for_removal(client, session, timeout=30)
    client.close()


def test_a_new_backend_removes_containers_whose_owner_is_gone(backend: ContainerBackend) -> None:
    assets = find_assets()
    assert assets is not None
    image, command = backend.image_for([str(assets.etcd), "--version"])
    dead_owner = "1:0"  # pid 1 exists, but not with that start time
    assert not owner_alive(dead_owner)
    stale = backend.client.containers.create(
        image, command, network="host", labels={LABEL: "stale-session", OWNER_LABEL: dead_owner}
    )
    second = ContainerBackend()
    try:
        assert stale.name in second.stale_removed
    finally:
        second.close()


def test_process_identity_tells_a_live_owner_from_a_gone_one() -> None:
    me = process_identity(os.getpid())
    assert me is not None and owner_alive(me)
    assert not owner_alive("not-a-pid")
    assert process_identity(2**22 + 1) is None


def test_a_container_that_cannot_start_is_removed_and_named(
    backend: ContainerBackend, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assets = find_assets()
    assert assets is not None
    image, _ = backend.image_for([str(assets.etcd)])
    monkeypatch.setattr(backend, "image_for", lambda _argv: (image, ["/testbed/no-such-binary"]))
    process = backend.process("broken", [str(assets.etcd)], tmp_path / "broken.log", mounts=(tmp_path,))
    with pytest.raises(TestbedError, match="broken: the container did not start"):
        process.start()
    assert _session_containers(backend) == []
    assert not process.running


def test_a_container_needs_its_directory_mounted(backend: ContainerBackend, tmp_path: Path) -> None:
    with pytest.raises(TestbedError, match="lonely: a container needs the directory of its files mounted"):
        backend.process("lonely", ["/bin/true"], tmp_path / "lonely.log")


def test_a_session_that_leaks_containers_fails_and_removes_them(tmp_path: Path) -> None:
    leaky = tmp_path / "test_leaky.py"
    leaky.write_text(
        textwrap.dedent(
            """
            from mcruntime.testing import Fleet

            def test_starts_a_cluster_and_never_stops_it(tmp_path):
                Fleet(workdir=tmp_path, backend="container").add("leaky")
            """
        )
    )
    import docker

    client = docker.from_env()
    with subprocess.Popen(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(leaky)],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    ) as inner:
        output, _ = inner.communicate(timeout=120)
        owner_prefix = f"{inner.pid}:"
    assert inner.returncode == 1, output
    assert "1 passed" in output
    assert "left running and killed: container mcruntime-" in output
    left = [
        c.name
        for c in client.containers.list(all=True, filters={"label": LABEL}, ignore_removed=True)
        if (c.labels or {}).get(OWNER_LABEL, "").startswith(owner_prefix)
    ]
    client.close()
    assert left == []
