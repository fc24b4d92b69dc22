"""How the testbed finds its binaries, without building anything."""

from __future__ import annotations

import shutil
import stat
from pathlib import Path

import pytest

from mcruntime.testing import AssetsError, _assets
from mcruntime.testing._versions import staging_version


def _executable(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    for variable in ("TEST_ASSET_KUBE_APISERVER", "TEST_ASSET_ETCD", "KUBEBUILDER_ASSETS"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    return tmp_path


def test_per_binary_variables_win_over_kubebuilder_assets(
    clean_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    apiserver = _executable(clean_env / "explicit" / "my-apiserver")
    assets_dir = clean_env / "assets"
    _executable(assets_dir / "kube-apiserver")
    etcd = _executable(assets_dir / "etcd")
    monkeypatch.setenv("TEST_ASSET_KUBE_APISERVER", str(apiserver))
    monkeypatch.setenv("KUBEBUILDER_ASSETS", str(assets_dir))
    found = _assets.find_assets()
    assert found is not None
    assert (found.kube_apiserver, found.kube_apiserver_source) == (apiserver, "TEST_ASSET_KUBE_APISERVER")
    assert (found.etcd, found.etcd_source) == (etcd, "KUBEBUILDER_ASSETS")


def test_the_cache_uses_setup_envtests_layout(clean_env: Path) -> None:
    cache = _assets.cache_dir()
    assert cache.parent == clean_env / "data" / "kubebuilder-envtest" / "k8s"
    assert cache.name.startswith("1.36.")
    _executable(cache / "kube-apiserver")
    _executable(cache / "etcd")
    found = _assets.find_assets()
    assert found is not None
    assert found.etcd == cache / "etcd"


def test_a_variable_naming_a_missing_file_is_an_error_that_names_it(
    clean_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TEST_ASSET_ETCD", str(clean_env / "nowhere" / "etcd"))
    with pytest.raises(AssetsError, match=r"TEST_ASSET_ETCD=.*nowhere/etcd is not an executable"):
        _assets.find_assets()


def test_without_go_the_error_says_what_to_install_or_set(
    clean_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(shutil, "which", lambda _name: None)
    with pytest.raises(AssetsError) as raised:
        _assets.ensure_assets(progress=lambda _message: None)
    message = str(raised.value)
    assert "install Go" in message
    assert "KUBEBUILDER_ASSETS" in message
    assert "TEST_ASSET_KUBE_APISERVER" in message


def test_staging_modules_are_read_from_the_go_mod() -> None:
    go_mod = """module k8s.io/kubernetes
replace (
\tk8s.io/api => ./staging/src/k8s.io/api
\tk8s.io/client-go => ./staging/src/k8s.io/client-go
\tgithub.com/example/other => github.com/example/other v1.0.0
)
"""
    assert _assets._staging_modules(go_mod) == ["k8s.io/api", "k8s.io/client-go"]


def test_staging_version_follows_the_kubernetes_release() -> None:
    assert staging_version("1.36.4") == "v0.36.4"
    with pytest.raises(ValueError, match="unexpected Kubernetes version"):
        staging_version("2.0.0")


def test_a_kubebuilder_assets_directory_without_the_binaries_is_named(
    clean_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = _assets.cache_dir()  # a cache that would otherwise be used in silence
    _executable(cache / "kube-apiserver")
    _executable(cache / "etcd")
    empty = clean_env / "typo"
    empty.mkdir()
    monkeypatch.setenv("KUBEBUILDER_ASSETS", str(empty))
    with pytest.raises(
        AssetsError, match=r"KUBEBUILDER_ASSETS=.*typo: kube-apiserver there is not an executable"
    ):
        _assets.find_assets()
    monkeypatch.setenv("KUBEBUILDER_ASSETS", str(clean_env / "missing"))
    with pytest.raises(AssetsError, match=r"KUBEBUILDER_ASSETS=.*missing: no such directory"):
        _assets.find_assets()


def test_kubebuilder_assets_need_not_hold_the_workload_binaries(
    clean_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assets_dir = clean_env / "envtest"  # what setup-envtest leaves: kube-apiserver and etcd only
    _executable(assets_dir / "kube-apiserver")
    _executable(assets_dir / "etcd")
    monkeypatch.setenv("KUBEBUILDER_ASSETS", str(assets_dir))
    assert _assets.find_assets() is not None
    assert _assets.find_workload_assets() is None
