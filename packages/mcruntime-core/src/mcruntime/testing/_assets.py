"""Finding, or building, the binaries the testbed runs.

kube-apiserver and etcd are always needed. kube-controller-manager,
kube-scheduler and kwok are needed only by clusters that run workloads
(``Fleet(workloads=True)``), so they are found or built separately and only then.

Resolution follows controller-runtime's envtest so that anyone who already has
envtest assets reuses them: a per-binary variable, then ``KUBEBUILDER_ASSETS``,
then a cache laid out like setup-envtest's store, and only then a build with the
local Go toolchain through the Go module proxy (minutes the first time, so the
build reports progress and the result is cached outside any repository).
"""

from __future__ import annotations

import fcntl
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from ._errors import AssetsError
from ._versions import ETCD_VERSION, GO_LANGUAGE, KUBERNETES_VERSION, KWOK_VERSION, staging_version

Progress = Callable[[str], None]

APISERVER = "kube-apiserver"
ETCD = "etcd"
CONTROLLER_MANAGER = "kube-controller-manager"
SCHEDULER = "kube-scheduler"
KWOK = "kwok"
ETCD_PACKAGE = "go.etcd.io/etcd/server/v3"
KWOK_PACKAGE = "sigs.k8s.io/kwok/cmd/kwok"
_ENV_BY_BINARY = {
    APISERVER: "TEST_ASSET_KUBE_APISERVER",
    ETCD: "TEST_ASSET_ETCD",
    CONTROLLER_MANAGER: "TEST_ASSET_KUBE_CONTROLLER_MANAGER",
    SCHEDULER: "TEST_ASSET_KUBE_SCHEDULER",
    KWOK: "TEST_ASSET_KWOK",
}
WORKLOAD_BINARIES = (CONTROLLER_MANAGER, SCHEDULER, KWOK)


@dataclass(frozen=True)
class Assets:
    """Paths of the two binaries, and where each was found (for diagnostics)."""

    kube_apiserver: Path
    etcd: Path
    kube_apiserver_source: str
    etcd_source: str


@dataclass(frozen=True)
class WorkloadAssets:
    """The binaries that make a control plane run Pods: controllers, scheduler, simulated nodes."""

    kube_controller_manager: Path
    kube_scheduler: Path
    kwok: Path
    sources: dict[str, str]


def _stderr_progress(message: str) -> None:
    print(f"[mcruntime.testing] {message}", file=sys.stderr, flush=True)


def _platform_suffix() -> str:
    arch = {"x86_64": "amd64", "aarch64": "arm64", "arm64": "arm64"}.get(
        platform.machine().lower(), platform.machine().lower()
    )
    return f"{sys.platform}-{arch}"


def cache_dir(kubernetes_version: str = KUBERNETES_VERSION) -> Path:
    """The directory our own builds go to, in setup-envtest's store layout.

    Pointing ``KUBEBUILDER_ASSETS`` at it lets Go envtest users share the build.
    """
    data_home = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(data_home) / "kubebuilder-envtest" / "k8s" / f"{kubernetes_version}-{_platform_suffix()}"


def _is_executable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


def _find_one(binary: str) -> tuple[Path, str] | None:
    variable = _ENV_BY_BINARY[binary]
    explicit = os.environ.get(variable)
    if explicit:
        path = Path(explicit).expanduser()
        if not _is_executable(path):
            raise AssetsError(f"{variable}={explicit} is not an executable file")
        return path, variable
    assets_dir = os.environ.get("KUBEBUILDER_ASSETS")
    if assets_dir:
        path = Path(assets_dir).expanduser() / binary
        if _is_executable(path):
            return path, "KUBEBUILDER_ASSETS"
        if binary in (APISERVER, ETCD):
            # Set but wrong (a typo, an empty directory): say so, as envtest does, rather than
            # fall through to the cache or to a build of minutes. (envtest's directory holds
            # no workload binaries: those are looked for further on.)
            if not Path(assets_dir).expanduser().is_dir():
                raise AssetsError(f"KUBEBUILDER_ASSETS={assets_dir}: no such directory")
            raise AssetsError(f"KUBEBUILDER_ASSETS={assets_dir}: {binary} there is not an executable file")
    cached = cache_dir() / binary
    if _is_executable(cached):
        return cached, f"cache {cache_dir()}"
    return None


def find_assets() -> Assets | None:
    """Return the binaries if both exist already; never builds anything."""
    apiserver = _find_one(APISERVER)
    etcd = _find_one(ETCD)
    if apiserver is None or etcd is None:
        return None
    return Assets(apiserver[0], etcd[0], apiserver[1], etcd[1])


def ensure_assets(progress: Progress | None = None) -> Assets:
    """Return both binaries, building whichever is missing into the cache."""
    report = progress or _stderr_progress
    found = {binary: _find_one(binary) for binary in (APISERVER, ETCD)}
    missing = [binary for binary, hit in found.items() if hit is None]
    if missing:
        target = cache_dir()
        target.mkdir(parents=True, exist_ok=True)
        with _build_lock(target):
            # Another process may have finished the build while we waited.
            found = {binary: _find_one(binary) for binary in (APISERVER, ETCD)}
            for binary in [b for b, hit in found.items() if hit is None]:
                builder = _build_apiserver if binary == APISERVER else _build_etcd
                builder(target / binary, report)
                found[binary] = (target / binary, f"built into {target}")
    apiserver, etcd = found[APISERVER], found[ETCD]
    assert apiserver is not None
    assert etcd is not None
    return Assets(apiserver[0], etcd[0], apiserver[1], etcd[1])


def find_workload_assets() -> WorkloadAssets | None:
    """Return the three workload binaries if all exist already; never builds anything."""
    found = {binary: _find_one(binary) for binary in WORKLOAD_BINARIES}
    if any(hit is None for hit in found.values()):
        return None
    return _workload_assets(found)


def _workload_assets(found: dict[str, tuple[Path, str] | None]) -> WorkloadAssets:
    paths = {binary: hit for binary, hit in found.items() if hit is not None}
    return WorkloadAssets(
        kube_controller_manager=paths[CONTROLLER_MANAGER][0],
        kube_scheduler=paths[SCHEDULER][0],
        kwok=paths[KWOK][0],
        sources={binary: hit[1] for binary, hit in paths.items()},
    )


def ensure_workload_assets(progress: Progress | None = None) -> WorkloadAssets:
    """Return kube-controller-manager, kube-scheduler and kwok, building whichever is missing.

    The two Kubernetes components are built from the same ``k8s.io/kubernetes``
    release as kube-apiserver (so their API knowledge matches), kwok from its
    own module; all land in the same cache directory.
    """
    report = progress or _stderr_progress
    found = {binary: _find_one(binary) for binary in WORKLOAD_BINARIES}
    if any(hit is None for hit in found.values()):
        target = cache_dir()
        target.mkdir(parents=True, exist_ok=True)
        with _build_lock(target):
            found = {binary: _find_one(binary) for binary in WORKLOAD_BINARIES}
            kubernetes = [b for b in (CONTROLLER_MANAGER, SCHEDULER) if found[b] is None]
            if kubernetes:
                _build_kubernetes({binary: target / binary for binary in kubernetes}, report)
            if found[KWOK] is None:
                _build_kwok(target / KWOK, report)
            for binary, hit in found.items():
                if hit is None:
                    found[binary] = (target / binary, f"built into {target}")
    return _workload_assets(found)


@contextmanager
def _build_lock(directory: Path) -> Iterator[None]:
    with open(directory / ".build.lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


# --- building with Go ---------------------------------------------------------


def _go_binary() -> str:
    go = shutil.which("go")
    if go is None:
        raise AssetsError(
            "kube-apiserver and etcd were not found and Go is not installed to build them.\n"
            f"Either install Go >= {GO_LANGUAGE.rsplit('.', 1)[0]} (https://go.dev/dl, or your "
            "distribution's golang package) so the testbed can build them from the Go module "
            "proxy, or point KUBEBUILDER_ASSETS (a directory holding kube-apiserver and etcd) "
            "or TEST_ASSET_KUBE_APISERVER / TEST_ASSET_ETCD at existing binaries."
        )
    version = subprocess.run([go, "env", "GOVERSION"], capture_output=True, text=True, check=False)
    match = re.match(r"go(\d+)\.(\d+)", version.stdout.strip())
    wanted = tuple(int(part) for part in GO_LANGUAGE.split(".")[:2])
    if match is None or (int(match[1]), int(match[2])) < wanted:
        raise AssetsError(
            f"Go {version.stdout.strip() or '(unknown)'} is too old to build Kubernetes "
            f"{KUBERNETES_VERSION}: it needs Go >= {'.'.join(map(str, wanted))}."
        )
    return go


def _go_environment() -> dict[str, str]:
    env = dict(os.environ)
    # GOTOOLCHAIN=local: never let a go.mod silently download another toolchain.
    env.update(GOTOOLCHAIN="local", GOWORK="off", GOFLAGS="-mod=mod", CGO_ENABLED="0")
    return env


def _niceness_prefix() -> list[str]:
    """``nice -n N`` when ``MCRUNTIME_BUILD_NICENESS`` asks for it (a shared machine)."""
    niceness = os.environ.get("MCRUNTIME_BUILD_NICENESS", "").strip()
    if not niceness:
        return []
    if not niceness.isdigit() or int(niceness) > 19:
        raise AssetsError(f"MCRUNTIME_BUILD_NICENESS={niceness!r} is not a niceness from 0 to 19")
    nice = shutil.which("nice")
    return [nice, "-n", niceness] if nice else []


def _run_go(
    args: list[str],
    workdir: Path,
    report: Progress,
    step: str,
    count_packages: bool = False,
    env: dict[str, str] | None = None,
) -> str:
    go = _go_binary()
    started = time.monotonic()
    report(f"{step} ...")
    tail: list[str] = []
    compiled = 0
    last_report = started
    with subprocess.Popen(
        [*_niceness_prefix(), go, *args],
        cwd=workdir,
        env={**_go_environment(), **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    ) as process:
        assert process.stdout is not None
        for line in process.stdout:
            tail = [*tail[-40:], line.rstrip()]
            if count_packages and not line.startswith(("go: ", "#")):
                compiled += 1
            now = time.monotonic()
            if now - last_report >= 15:
                detail = f"{compiled} packages compiled, " if count_packages else ""
                report(f"{step}: {detail}{now - started:.0f}s so far")
                last_report = now
    if process.wait() != 0:
        raise AssetsError(f"{step} failed (go {' '.join(args)}):\n" + "\n".join(tail))
    report(f"{step}: done in {time.monotonic() - started:.0f}s")
    return "\n".join(tail)


def _version_ldflags(kubernetes_version: str) -> str:
    minor = kubernetes_version.split(".")[1]
    flags = ["-s", "-w"]
    for package in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version"):
        flags += [
            f"-X {package}.gitVersion=v{kubernetes_version}",
            f"-X {package}.gitMajor=1",
            f"-X {package}.gitMinor={minor}",
            f"-X {package}.gitTreeState=clean",
        ]
    return " ".join(flags)


def _staging_modules(go_mod_text: str) -> list[str]:
    """The ``k8s.io/X => ./staging/...`` replaces of k8s.io/kubernetes's go.mod.

    Read from the proxy-served go.mod rather than hard-coded, so a new minor that
    adds staging modules keeps building.
    """
    pattern = re.compile(r"^\s*(k8s\.io/[A-Za-z0-9._-]+)\s*=>\s*\./staging/", re.MULTILINE)
    return pattern.findall(go_mod_text)


def _build_apiserver(output: Path, report: Progress) -> None:
    _build_kubernetes({APISERVER: output}, report)


def _build_kubernetes(outputs: dict[str, Path], report: Progress) -> None:
    """Build commands of ``k8s.io/kubernetes`` (``cmd/<name>``) in one throwaway module.

    The staging modules are replaced by their published versions, as upstream's
    own go.mod does with local directories; the commands share the module graph
    and the build cache, so a second command costs only its own packages.
    """
    version = KUBERNETES_VERSION
    names = " and ".join(outputs)
    directory = next(iter(outputs.values())).parent
    report(
        f"building {names} v{version} from the Go module proxy into {directory} "
        "(several minutes the first time; later runs reuse it)"
    )
    with tempfile.TemporaryDirectory(prefix="mcruntime-kube-build-") as scratch:
        workdir = Path(scratch)
        _run_go(["mod", "init", "mcruntime.local/kubebuild"], workdir, report, "go mod init")
        language = GO_LANGUAGE.rsplit(".", 1)[0]
        _run_go(
            ["mod", "edit", f"-go={GO_LANGUAGE}", f"-godebug=default=go{language}"],
            workdir,
            report,
            "go mod edit",
        )
        download = subprocess.run(
            [_go_binary(), "mod", "download", "-json", f"k8s.io/kubernetes@v{version}"],
            cwd=workdir,
            env=_go_environment(),
            capture_output=True,
            text=True,
            check=False,
        )
        try:
            info = json.loads(download.stdout)
        except json.JSONDecodeError:
            info = {}
        if download.returncode != 0 or "GoMod" not in info:
            raise AssetsError(
                f"could not download k8s.io/kubernetes@v{version} from the Go module proxy: "
                f"{info.get('Error') or download.stderr.strip()}"
            )
        modules = _staging_modules(Path(info["GoMod"]).read_text())
        staged = staging_version(version)
        replaces = [f"-replace={module}={module}@{staged}" for module in modules]
        _run_go(["mod", "edit", *replaces], workdir, report, f"replace {len(modules)} staging modules")
        _run_go(
            ["get", *(f"k8s.io/kubernetes/cmd/{name}@v{version}" for name in outputs)],
            workdir,
            report,
            f"download {names}'s modules",
        )
        for name, output in outputs.items():
            partial = output.with_name(output.name + ".partial")
            _run_go(
                [
                    "build",
                    "-v",
                    "-trimpath",
                    "-ldflags",
                    _version_ldflags(version),
                    "-o",
                    str(partial),
                    f"k8s.io/kubernetes/cmd/{name}",
                ],
                workdir,
                report,
                f"compile {name}",
                count_packages=True,
            )
            partial.replace(output)


def _build_kwok(output: Path, report: Progress) -> None:
    """``go install`` kwok by module name: its go.mod has no replaces, so no build module is needed."""
    report(f"building kwok v{KWOK_VERSION} from the Go module proxy into {output.parent}")
    with tempfile.TemporaryDirectory(prefix="mcruntime-kwok-build-") as scratch:
        workdir = Path(scratch)
        _run_go(
            [
                "install",
                "-v",
                "-trimpath",
                "-ldflags",
                "-s -w",
                f"{KWOK_PACKAGE}@v{KWOK_VERSION}",
            ],
            workdir,
            report,
            "compile kwok",
            count_packages=True,
            env={"GOBIN": str(workdir / "bin"), "GOFLAGS": ""},
        )
        partial = output.with_name(output.name + ".partial")
        shutil.copy2(workdir / "bin" / KWOK, partial)
        partial.replace(output)


def _build_etcd(output: Path, report: Progress) -> None:
    report(f"building etcd v{ETCD_VERSION} from the Go module proxy into {output.parent}")
    with tempfile.TemporaryDirectory(prefix="mcruntime-etcd-build-") as scratch:
        workdir = Path(scratch)
        _run_go(["mod", "init", "mcruntime.local/etcdbuild"], workdir, report, "go mod init")
        _run_go(
            ["get", f"{ETCD_PACKAGE}@v{ETCD_VERSION}"],
            workdir,
            report,
            "download etcd's modules",
        )
        partial = output.with_name(output.name + ".partial")
        _run_go(
            ["build", "-v", "-trimpath", "-ldflags", "-s -w", "-o", str(partial), ETCD_PACKAGE],
            workdir,
            report,
            "compile etcd",
            count_packages=True,
        )
        partial.replace(output)
