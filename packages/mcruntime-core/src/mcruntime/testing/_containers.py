"""The container backend: each testbed component in a container, through testcontainers.

The image is built here, from the binaries the testbed already has
(``FROM scratch``: they are static, so nothing else goes in and no registry is
asked for a base image). Containers use the host's network, so a component
listens on the same loopback port as it would as a process, and the cluster's
directory is mounted at the same path, so every argument stays valid.

Cleanup does not depend on the test process ending well. Ryuk (testcontainers'
own reaper) needs an image from a registry, so it stays off; instead every
container is labelled with this session and its owner's process identity, and

- closing the backend (or the interpreter exiting) removes the session's containers;
- a small reaper process, started with the first container, outlives a killed
  test process long enough to remove them;
- starting a backend removes containers whose owner no longer exists.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
import weakref
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ._errors import TestbedError

if TYPE_CHECKING:
    from docker import DockerClient as RawDockerClient
    from docker.models.containers import Container

LABEL = "dev.mcruntime.testbed"
"""Every testbed container carries it; the value is the session."""
OWNER_LABEL = "dev.mcruntime.testbed.owner"
"""``<pid>:<start time>`` of the process that started the container."""
IMAGE_REPOSITORY = "mcruntime-testbed"
IN_IMAGE = Path("/testbed")
_PASSED_ENV = ("GOMAXPROCS", "GOGC", "GOMEMLIMIT")
_backends: weakref.WeakSet[ContainerBackend] = weakref.WeakSet()


def process_identity(pid: int) -> str | None:
    """``pid:starttime``: stays unique when the kernel reuses the pid; ``None`` if it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may hold spaces; the fields after it do not.
    fields = stat.rsplit(")", 1)[-1].split()
    return f"{pid}:{fields[19]}"


def owner_alive(owner: str) -> bool:
    """Whether the process named by an owner label still runs (same pid, same start time)."""
    pid, _, _ = owner.partition(":")
    return pid.isdigit() and process_identity(int(pid)) == owner


def configure_testcontainers() -> None:
    """Ryuk off and the Docker host on loopback, whatever ``/.dockerenv`` suggests.

    testcontainers takes a ``/.dockerenv`` file as proof that it runs inside a
    container and then looks for a gateway or bridge address; our containers use
    the host's network, so the host is 127.0.0.1 and the mode is "docker host".
    """
    os.environ["TESTCONTAINERS_RYUK_DISABLED"] = "true"
    from testcontainers.core.config import ConnectionMode
    from testcontainers.core.config import testcontainers_config as config

    config.ryuk_disabled = True
    if not config.tc_host_override:
        config.tc_host_override = "127.0.0.1"
    config.connection_mode_override = ConnectionMode.docker_host


def _docker() -> RawDockerClient:
    configure_testcontainers()
    from docker.errors import DockerException
    from testcontainers.core.docker_client import DockerClient

    try:
        client = DockerClient().client
        client.ping()
    except DockerException as error:
        raise TestbedError(
            "the container backend needs a Docker daemon; none answered "
            f"(DOCKER_HOST={os.environ.get('DOCKER_HOST', 'unset')}): {error}"
        ) from error
    return client


def _available_binaries() -> list[Path]:
    """Every testbed binary already found on this machine (none is built here)."""
    from ._assets import find_assets, find_workload_assets

    found: list[Path] = []
    assets = find_assets()
    if assets is not None:
        found += [assets.kube_apiserver.resolve(), assets.etcd.resolve()]
    workloads = find_workload_assets()
    if workloads is not None:
        found += [
            workloads.kube_controller_manager.resolve(),
            workloads.kube_scheduler.resolve(),
            workloads.kwok.resolve(),
        ]
    return found


def remove_containers(
    client: RawDockerClient, *, session: str | None = None, stale: bool = False
) -> list[str]:
    """Remove a session's testbed containers, or (``stale``) those whose owner is gone; returns names."""
    removed: list[str] = []
    # ignore_removed: a container removed between the listing and its inspection (by the
    # reaper, say) is not an error here; docker-py raises NotFound for it otherwise.
    for container in client.containers.list(all=True, filters={"label": LABEL}, ignore_removed=True):
        labels = container.labels or {}
        ours = session is not None and labels.get(LABEL) == session
        orphaned = stale and not owner_alive(labels.get(OWNER_LABEL, ""))
        if ours or orphaned:
            with contextlib.suppress(Exception):  # already gone, or removal in progress
                container.remove(force=True)
                removed.append(str(container.name))
    return removed


def sweep_session_leftovers() -> list[str]:
    """Remove what any backend of this process left behind; returns the names (empty when all was stopped)."""
    found: list[str] = []
    for backend in list(_backends):
        found += backend.removed_at_close
        backend.removed_at_close = []
        found += remove_containers(backend.client, session=backend.session)
    return found


class ContainerProcess:
    """One component in one container; the same interface as a ManagedProcess."""

    def __init__(
        self,
        backend: ContainerBackend,
        name: str,
        argv: Sequence[str],
        log_path: Path,
        mounts: Sequence[Path],
        env: dict[str, str],
    ) -> None:
        self.name = name
        self.argv = list(argv)
        self.log_path = log_path
        self._backend = backend
        self._mounts = [Path(m).resolve() for m in mounts]
        self._env = env
        self._container: Container | None = None
        self._exit_code: int | None = None

    def __repr__(self) -> str:
        return f"<ContainerProcess {self.name} running={self.running}>"

    def _state(self) -> dict[str, Any]:
        if self._container is None:
            return {}
        try:
            self._container.reload()
        except Exception:  # removed behind our back
            return {}
        state = self._container.attrs.get("State") or {}
        return state if isinstance(state, dict) else {}

    @property
    def pid(self) -> int | None:
        pid = self._state().get("Pid")
        return int(pid) if pid else None

    @property
    def running(self) -> bool:
        return bool(self._state().get("Running"))

    @property
    def exit_code(self) -> int | None:
        if self._container is None:
            return self._exit_code
        state = self._state()
        if not state or state.get("Running"):
            return None
        return int(state.get("ExitCode", 0))

    def start(self) -> None:
        if self.running:
            raise RuntimeError(f"{self.name} is already running")
        from testcontainers.core.container import DockerContainer

        image, command = self._backend.image_for(self.argv)
        container = DockerContainer(image).with_command(command).with_tmpfs_mount("/tmp")  # noqa: S108 -- the container's own tmpfs
        for mount in self._mounts:
            container.with_volume_mapping(str(mount), str(mount), "rw")
        for key, value in self._env.items():
            container.with_env(key, value)
        container.with_name(f"mcruntime-{self._backend.session}-{uuid.uuid4().hex[:6]}")
        container.with_kwargs(
            network="host",  # no bridge exists; ports are the host's loopback ports
            labels={LABEL: self._backend.session, OWNER_LABEL: self._backend.owner},
        )
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._backend.ensure_reaper()
        try:
            container.start()
        except Exception as error:
            created = container._container  # created but not started: never leave it behind
            if created is not None:
                with contextlib.suppress(Exception):
                    created.remove(force=True)
            raise TestbedError(f"{self.name}: the container did not start: {error}") from error
        self._container = container.get_wrapped_container()
        self._exit_code = None

    def _finish(self) -> None:
        container, self._container = self._container, None
        if container is None:
            return
        with contextlib.suppress(Exception):
            container.reload()
            self._exit_code = int((container.attrs.get("State") or {}).get("ExitCode", 0))
            with open(self.log_path, "ab") as log:
                log.write(container.logs(stdout=True, stderr=True))
        with contextlib.suppress(Exception):
            container.remove(force=True)

    def stop(self, timeout: float = 15.0) -> None:
        """SIGTERM, then SIGKILL after ``timeout``; keeps the output in ``log_path``; removes it."""
        if self._container is None:
            return
        with contextlib.suppress(Exception):
            self._container.stop(timeout=max(1, round(timeout)))
        self._finish()

    def kill(self) -> None:
        """SIGKILL at once: an abrupt failure, for fault tests."""
        if self._container is None:
            return
        with contextlib.suppress(Exception):
            self._container.kill()
            self._container.wait(timeout=10)
        self._finish()

    def log_tail(self, lines: int = 25) -> str:
        if self._container is not None:
            with contextlib.suppress(Exception):
                output: bytes = self._container.logs(tail=lines)
                return output.decode(errors="replace")
        try:
            text = self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""
        return "\n".join(text.splitlines()[-lines:])


class ContainerBackend:
    """Components as containers of a locally built scratch image, on the host's network."""

    name = "container"

    def __init__(self) -> None:
        self.session = uuid.uuid4().hex[:12]
        """The label value of every container of this backend."""
        self.client = _docker()
        identity = process_identity(os.getpid())
        assert identity is not None
        self.owner = identity
        self._lock = threading.Lock()
        self._binaries: dict[str, Path] = {}  # name in the image -> binary on the host
        self._image: str | None = None
        self._reaper: subprocess.Popen[bytes] | None = None
        self.stale_removed = remove_containers(self.client, stale=True)
        self.removed_at_close: list[str] = []
        """Containers still there when the backend closed: a component nobody stopped."""
        _backends.add(self)
        atexit.register(self.close)

    def __repr__(self) -> str:
        return f"<ContainerBackend session={self.session} image={self._image}>"

    # --- the image ----------------------------------------------------------------

    def image_for(self, argv: Sequence[str]) -> tuple[str, list[str]]:
        """The image holding ``argv[0]`` (built if needed) and the command inside it."""
        binary = Path(argv[0]).resolve()
        with self._lock:
            name = binary.name
            known = self._binaries.get(name)
            if known is not None and known != binary:
                raise TestbedError(
                    f"the container image cannot hold both {known} and {binary}: they share the name {name!r}"
                )
            if known is None or self._image is None:
                self._binaries[name] = binary
                for other in _available_binaries():  # one image for all, not one per new binary
                    self._binaries.setdefault(other.name, other)
                self._image = self._build_image()
            return self._image, [str(IN_IMAGE / name), *argv[1:]]

    def _build_image(self) -> str:
        fingerprint = hashlib.sha256()
        for name, path in sorted(self._binaries.items()):
            stat = path.stat()
            fingerprint.update(f"{name}\0{path}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
        tag = f"{IMAGE_REPOSITORY}:{fingerprint.hexdigest()[:16]}"
        from docker.errors import BuildError, ImageNotFound

        try:
            self.client.images.get(tag)
            return tag
        except ImageNotFound:
            pass
        from testcontainers.core.image import DockerImage

        with tempfile.TemporaryDirectory(prefix="mcruntime-image-") as context:
            lines = ["FROM scratch"]
            for name, path in sorted(self._binaries.items()):
                target = Path(context) / name
                try:
                    os.link(path, target)
                except OSError:  # another filesystem
                    shutil.copy2(path, target)
                lines.append(f"COPY {name} {IN_IMAGE / name}")
            lines.append("ENTRYPOINT []")
            (Path(context) / "Dockerfile").write_text("\n".join(lines) + "\n")
            try:
                DockerImage(path=context, tag=tag, clean_up=False, pull=False).build()
            except BuildError as error:
                raise TestbedError(f"building the testbed image {tag} failed: {error}") from error
        return tag

    # --- processes ------------------------------------------------------------------

    def process(
        self,
        name: str,
        argv: Sequence[str],
        log_path: Path,
        *,
        mounts: Sequence[Path] = (),
        env: dict[str, str] | None = None,
    ) -> ContainerProcess:
        # Only the variables meant for the component: the test process's own
        # environment (tokens, paths) never reaches a container.
        passed = {key: value for key, value in (env or {}).items() if key in _PASSED_ENV}
        if not mounts:
            raise TestbedError(f"{name}: a container needs the directory of its files mounted")
        return ContainerProcess(self, name, argv, log_path, mounts, passed)

    def ensure_reaper(self) -> None:
        """Start, once, the process that removes our containers if this one dies uncleanly."""
        with self._lock:
            if self._reaper is not None and self._reaper.poll() is None:
                return
            self._reaper = subprocess.Popen(
                [sys.executable, "-m", "mcruntime.testing._reaper", self.owner, self.session],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,  # not in our process group: a Ctrl-C must not stop it
            )

    def leftovers(self) -> list[str]:
        """Names of this session's containers that still exist."""
        found = self.client.containers.list(
            all=True, filters={"label": f"{LABEL}={self.session}"}, ignore_removed=True
        )
        return [str(container.name) for container in found]

    def close(self) -> None:
        """Remove every container of this session (idempotent; also runs at exit)."""
        with contextlib.suppress(Exception):
            self.removed_at_close += remove_containers(self.client, session=self.session)
        reaper, self._reaper = self._reaper, None
        if reaper is not None and reaper.poll() is None:
            reaper.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                reaper.wait(5)


def wait_for_removal(client: RawDockerClient, session: str, timeout: float) -> bool:
    """Whether the session's containers are all gone within ``timeout`` (for tests of the reaper)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        # The reaper removes them while we look: one gone between the listing and its
        # inspection is gone, not an error (docker-py raised NotFound for it, failing CI once).
        if not client.containers.list(all=True, filters={"label": f"{LABEL}={session}"}, ignore_removed=True):
            return True
        time.sleep(0.2)
    return False
