"""Kubeconfig sources: files that cannot be read, the KUBECONFIG list, the in-cluster service account."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from test_kubeconfig import (
    TOKEN,
    kubeconfig,
    write_file,
    write_yaml,
)

from mcruntime._base.errors import KubeconfigError
from mcruntime._config.kubeconfig import (
    TrustPolicy,
    in_cluster_config,
    kubeconfig_from_dict,
    kubeconfig_paths_from_env,
    load_kubeconfig,
    load_kubeconfig_env,
)

# -- unreadable files -----------------------------------------------------------------


def test_an_empty_file_is_an_error_naming_the_file(tmp_path: Path) -> None:
    path = write_file(tmp_path / "config", "")

    with pytest.raises(KubeconfigError, match="the document is empty") as caught:
        load_kubeconfig(path)

    assert caught.value.origin == str(path)
    assert str(path) in str(caught.value)


def test_invalid_yaml_is_an_error_naming_the_file_and_the_line(tmp_path: Path) -> None:
    path = write_file(tmp_path / "config", "clusters:\n- name: dev\n  cluster: {server: [unclosed\n")

    with pytest.raises(KubeconfigError, match="not valid YAML at line") as caught:
        load_kubeconfig(path)

    assert str(path) in str(caught.value)


def test_a_top_level_that_is_not_a_mapping_is_an_error_naming_the_file(tmp_path: Path) -> None:
    path = write_file(tmp_path / "config", "- just\n- a list\n")

    with pytest.raises(KubeconfigError, match="not a mapping") as caught:
        load_kubeconfig(path)

    assert str(path) in str(caught.value)


def test_a_file_that_does_not_exist_is_an_error_naming_the_file(tmp_path: Path) -> None:
    with pytest.raises(KubeconfigError, match="cannot read the file") as caught:
        load_kubeconfig(tmp_path / "absent")

    assert str(tmp_path / "absent") in str(caught.value)


def test_a_dict_argument_that_is_not_a_mapping_is_an_error() -> None:
    with pytest.raises(KubeconfigError, match="not a mapping"):
        kubeconfig_from_dict(["not", "a", "mapping"], origin="secret ns/kc")  # type: ignore[arg-type]


# -- KUBECONFIG -----------------------------------------------------------------------


def test_kubeconfig_with_two_files_takes_the_first_entry_of_each_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = write_yaml(
        tmp_path / "a" / "config",
        kubeconfig({"server": "https://first.example"}, {"token": "made-up-first"}, name="shared"),
    )
    second_data = kubeconfig({"server": "https://second.example"}, {"token": "made-up-second"}, name="shared")
    second_data["clusters"].append(
        {"name": "only-second", "cluster": {"server": "https://only-second.example"}}
    )
    second_data["contexts"].append(
        {"name": "only-second", "context": {"cluster": "only-second", "user": "shared"}}
    )
    second = write_yaml(tmp_path / "b" / "config", second_data)
    monkeypatch.setenv("KUBECONFIG", os.pathsep.join([str(first), str(second)]))

    shared = load_kubeconfig_env("shared")
    only_second = load_kubeconfig_env("only-second")

    assert shared.server == "https://first.example"
    assert shared.user["token"] == "made-up-first"
    assert only_second.server == "https://only-second.example"
    assert only_second.user["token"] == "made-up-first"  # the user "shared" came from the first file
    assert shared.origin == os.pathsep.join([str(first), str(second)])


def test_kubeconfig_takes_the_current_context_from_the_first_file_that_sets_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    without = write_yaml(
        tmp_path / "0" / "config", kubeconfig({"server": "https://zero.example"}, current=False)
    )
    first = write_yaml(tmp_path / "1" / "config", kubeconfig({"server": "https://one.example"}, name="one"))
    second = write_yaml(tmp_path / "2" / "config", kubeconfig({"server": "https://two.example"}, name="two"))
    monkeypatch.setenv("KUBECONFIG", os.pathsep.join(map(str, (without, first, second))))

    config = load_kubeconfig_env()

    assert config.context == "one"
    assert config.server == "https://one.example"


def test_kubeconfig_resolves_relative_paths_against_each_files_own_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ca = write_file(tmp_path / "clusters" / "ca.crt")
    token = write_file(tmp_path / "users" / "token", TOKEN)
    clusters_only = {
        "clusters": [
            {"name": "dev", "cluster": {"server": "https://dev.example", "certificate-authority": "ca.crt"}}
        ],
        "contexts": [{"name": "dev", "context": {"cluster": "dev", "user": "me"}}],
        "current-context": "dev",
    }
    users_only = {"users": [{"name": "me", "user": {"tokenFile": "token"}}]}
    first = write_yaml(tmp_path / "clusters" / "config", clusters_only)
    second = write_yaml(tmp_path / "users" / "config", users_only)
    monkeypatch.setenv("KUBECONFIG", os.pathsep.join([str(first), str(second)]))
    monkeypatch.chdir(tmp_path)

    config = load_kubeconfig_env()

    assert config.cluster["certificate-authority"] == str(ca)
    assert config.user["tokenFile"] == str(token)


def test_kubeconfig_skips_a_listed_file_that_does_not_exist(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    present = write_yaml(tmp_path / "config", kubeconfig({"server": "https://dev.example"}))
    monkeypatch.setenv("KUBECONFIG", os.pathsep.join([str(tmp_path / "absent"), str(present), ""]))

    config = load_kubeconfig_env()

    assert config.server == "https://dev.example"
    assert config.origin == str(present)


def test_kubeconfig_listing_no_existing_file_is_an_error_naming_the_paths(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KUBECONFIG", os.pathsep.join([str(tmp_path / "a"), str(tmp_path / "b")]))

    with pytest.raises(KubeconfigError, match="no kubeconfig file found") as caught:
        load_kubeconfig_env()

    assert str(tmp_path / "a") in str(caught.value)
    assert str(tmp_path / "b") in str(caught.value)


def test_without_kubeconfig_the_default_is_the_home_kube_config(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_yaml(tmp_path / ".kube" / "config", kubeconfig({"server": "https://home.example"}))
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))

    assert kubeconfig_paths_from_env() == [tmp_path / ".kube" / "config"]
    assert load_kubeconfig_env().server == "https://home.example"


# -- in-cluster -----------------------------------------------------------------------


@pytest.fixture
def service_account(tmp_path: Path) -> Path:
    directory = tmp_path / "serviceaccount"
    write_file(directory / "ca.crt", "made-up ca\n")
    write_file(directory / "token", TOKEN)
    write_file(directory / "namespace", "default")
    return directory


def test_in_cluster_config_uses_the_service_host_the_mounted_ca_and_the_token_file(
    service_account: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")

    config = in_cluster_config(service_account)

    assert config.server == "https://10.96.0.1:443"
    assert config.cluster["certificate-authority"] == str(service_account / "ca.crt")
    assert config.user == {"tokenFile": str(service_account / "token")}  # re-read, never inlined
    assert config.origin == "in-cluster"
    assert config.trust == TrustPolicy(allow_local_files=True)  # its own mounted files; no exec, no insecure
    assert not config.insecure


def test_in_cluster_config_brackets_an_ipv6_service_host(
    service_account: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "fd00:10:96::1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")

    assert in_cluster_config(service_account).server == "https://[fd00:10:96::1]:443"


def test_in_cluster_config_outside_a_cluster_is_an_error(
    service_account: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")

    with pytest.raises(KubeconfigError, match="not running in a cluster"):
        in_cluster_config(service_account)


def test_in_cluster_config_without_the_mounted_files_is_an_error_naming_the_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")

    with pytest.raises(KubeconfigError, match="does not exist") as caught:
        in_cluster_config(tmp_path / "nothing-mounted")

    assert str(tmp_path / "nothing-mounted" / "ca.crt") in str(caught.value)
