"""Finding and building kube-controller-manager, kube-scheduler and kwok.

The build is driven against a stand-in ``go`` that records its command lines
and writes the binaries it is asked for: what is checked is what the testbed
asks Go to do (modules, replaces, packages, flags, priority) and where the
results land, not Go itself, which CI's cold build exercises for real.
"""

from __future__ import annotations

import json
import stat
import sys
from pathlib import Path

import pytest

from mcruntime.testing import AssetsError, _assets
from mcruntime.testing._versions import KUBERNETES_VERSION, KWOK_VERSION

FAKE_GO = """#!{python}
import json, os, sys
from pathlib import Path
args = sys.argv[1:]
with open({log!r}, "a") as log:
    log.write(json.dumps({{"args": args, "nice": os.environ.get("FAKE_NICE_SEEN", ""),
                          "gobin": os.environ.get("GOBIN", ""), "cgo": os.environ.get("CGO_ENABLED")}}) + "\\n")
if args[:2] == ["env", "GOVERSION"]:
    print("go1.26.8")
elif args[:3] == ["mod", "download", "-json"]:
    mod = Path({gomod!r})
    mod.write_text("replace (\\n\\tk8s.io/api => ./staging/src/k8s.io/api\\n\\tk8s.io/client-go => ./staging/src/k8s.io/client-go\\n)\\n")
    print(json.dumps({{"GoMod": str(mod)}}))
elif args and args[0] == "build":
    out = Path(args[args.index("-o") + 1])
    out.write_text("#!/bin/sh\\n")
    out.chmod(0o755)
    print(args[-1] + "/internal")
elif args and args[0] == "install":
    out = Path(os.environ["GOBIN"]) / "kwok"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("#!/bin/sh\\n")
    out.chmod(0o755)
"""

VARIABLES = (
    "TEST_ASSET_KUBE_APISERVER",
    "TEST_ASSET_ETCD",
    "TEST_ASSET_KUBE_CONTROLLER_MANAGER",
    "TEST_ASSET_KUBE_SCHEDULER",
    "TEST_ASSET_KWOK",
    "KUBEBUILDER_ASSETS",
    "MCRUNTIME_BUILD_NICENESS",
)


def _executable(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    for variable in VARIABLES:
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    return tmp_path


@pytest.fixture
def fake_go(clean_env: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A ``go`` first on PATH; returns the file it logs its calls to (one JSON line each)."""
    bin_dir = clean_env / "bin"
    bin_dir.mkdir()
    log = clean_env / "go-calls.jsonl"
    script = FAKE_GO.format(python=sys.executable, log=str(log), gomod=str(clean_env / "kubernetes.mod"))
    go = bin_dir / "go"
    go.write_text(script)
    go.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    return log


def _calls(log: Path) -> list[list[str]]:
    return [json.loads(line)["args"] for line in log.read_text().splitlines()]


def test_workload_binaries_are_found_like_the_others(
    clean_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assets_dir = clean_env / "assets"
    for name in ("kube-controller-manager", "kube-scheduler"):
        _executable(assets_dir / name)
    kwok = _executable(clean_env / "elsewhere" / "my-kwok")
    monkeypatch.setenv("KUBEBUILDER_ASSETS", str(assets_dir))
    monkeypatch.setenv("TEST_ASSET_KWOK", str(kwok))
    found = _assets.find_workload_assets()
    assert found is not None
    assert found.kwok == kwok
    assert found.kube_scheduler == assets_dir / "kube-scheduler"
    assert found.sources == {
        "kube-controller-manager": "KUBEBUILDER_ASSETS",
        "kube-scheduler": "KUBEBUILDER_ASSETS",
        "kwok": "TEST_ASSET_KWOK",
    }


def test_one_missing_workload_binary_means_none_are_found(clean_env: Path) -> None:
    cache = _assets.cache_dir()
    _executable(cache / "kube-controller-manager")
    _executable(cache / "kube-scheduler")
    assert _assets.find_workload_assets() is None


def test_missing_workload_binaries_are_built_into_the_cache(fake_go: Path) -> None:
    cache = _assets.cache_dir()
    _executable(cache / "kube-scheduler")  # already there: only the other two are built
    progress: list[str] = []
    found = _assets.ensure_workload_assets(progress.append)
    assert found.kube_controller_manager == cache / "kube-controller-manager"
    assert found.kwok == cache / "kwok"
    assert found.sources["kube-scheduler"].startswith("cache ")
    assert found.sources["kwok"] == f"built into {cache}"
    calls = _calls(fake_go)
    replaces = next(call for call in calls if call[:2] == ["mod", "edit"] and "-replace" in call[2])
    staged = f"v0.{KUBERNETES_VERSION.split('.', 1)[1]}"
    assert replaces[2:] == [
        f"-replace=k8s.io/api=k8s.io/api@{staged}",
        f"-replace=k8s.io/client-go=k8s.io/client-go@{staged}",
    ]
    assert ["get", f"k8s.io/kubernetes/cmd/kube-controller-manager@v{KUBERNETES_VERSION}"] in calls
    build = next(call for call in calls if call[0] == "build")
    assert build[-1] == "k8s.io/kubernetes/cmd/kube-controller-manager"
    assert (
        f"-X k8s.io/component-base/version.gitVersion=v{KUBERNETES_VERSION}"
        in build[build.index("-ldflags") + 1]
    )
    install = next(call for call in calls if call[0] == "install")
    assert install[-1] == f"sigs.k8s.io/kwok/cmd/kwok@v{KWOK_VERSION}"
    compiles = [json.loads(line) for line in fake_go.read_text().splitlines()]
    assert {entry["cgo"] for entry in compiles if entry["args"][0] in ("build", "install")} == {"0"}
    assert any("building kube-controller-manager" in line for line in progress)
    assert any(line.startswith("compile kwok: done in") for line in progress)
    assert not list(cache.glob("*.partial"))


def test_builds_run_under_nice_when_asked(fake_go: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MCRUNTIME_BUILD_NICENESS", "10")
    assert _assets._niceness_prefix()[1:] == ["-n", "10"]
    _assets.ensure_workload_assets(lambda _message: None)
    assert (_assets.cache_dir() / "kwok").exists()


@pytest.mark.parametrize("value", ["-3", "twenty", "20"])
def test_a_bad_niceness_is_named(clean_env: Path, monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("MCRUNTIME_BUILD_NICENESS", value)
    with pytest.raises(
        AssetsError, match=f"MCRUNTIME_BUILD_NICENESS='{value}' is not a niceness from 0 to 19"
    ):
        _assets._niceness_prefix()


def test_a_failed_build_says_which_step_and_shows_gos_output(
    fake_go: Path, monkeypatch: pytest.MonkeyPatch, clean_env: Path
) -> None:
    failing = clean_env / "bin" / "go"
    failing.write_text(
        failing.read_text().replace(
            'elif args and args[0] == "install":',
            'elif args and args[0] == "install":\n    print("cannot find module"); sys.exit(1)',
        )
    )
    _executable(_assets.cache_dir() / "kube-controller-manager")
    _executable(_assets.cache_dir() / "kube-scheduler")
    with pytest.raises(AssetsError, match=r"compile kwok failed \(go install .*\):\ncannot find module"):
        _assets.ensure_workload_assets(lambda _message: None)
    assert not (_assets.cache_dir() / "kwok").exists()
