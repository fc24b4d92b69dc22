"""Kubeconfig loading: contexts, file references, inline data, trust (more in test_kubeconfig_sources, _safety)."""

from __future__ import annotations

import base64
import os
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from mcruntime._base.errors import KubeconfigError, MCRuntimeError, TrustPolicyError
from mcruntime._config.kubeconfig import (
    TrustPolicy,
    kubeconfig_from_dict,
    list_contexts,
    load_kubeconfig,
)

# Made-up credentials: distinctive strings that must never show up in a repr or a message.
TOKEN = "made-up-token-3f9c2e71d04b"
PASSWORD = "made-up-password-b81d77"
KEY_MATERIAL = "made-up-key-material-55aa19"
KEY_DATA = base64.b64encode(
    f"-----BEGIN PRIVATE KEY-----\n{KEY_MATERIAL}\n-----END PRIVATE KEY-----\n".encode()
).decode()
CERT_DATA = base64.b64encode(
    b"-----BEGIN CERTIFICATE-----\nmade-up-cert\n-----END CERTIFICATE-----\n"
).decode()
CA_DATA = base64.b64encode(b"-----BEGIN CERTIFICATE-----\nmade-up-ca\n-----END CERTIFICATE-----\n").decode()
SECRETS = (TOKEN, PASSWORD, KEY_DATA, KEY_MATERIAL)


def kubeconfig(
    cluster: dict[str, Any],
    user: dict[str, Any] | None = None,
    *,
    name: str = "dev",
    current: bool = True,
) -> dict[str, Any]:
    """A kubeconfig with one cluster, one user and one context, all called ``name``."""
    context: dict[str, Any] = {"cluster": name}
    data: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": name, "cluster": cluster}],
        "contexts": [{"name": name, "context": context}],
        "users": [],
    }
    if user is not None:
        context["user"] = name
        data["users"].append({"name": name, "user": user})
    if current:
        data["current-context"] = name
    return data


def write_yaml(path: Path, data: Any) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(data))
    return path


def write_file(path: Path, content: str = "made-up file content\n") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(content)
    return path


def assert_no_secret(text: str) -> None:
    for secret in SECRETS:
        assert secret not in text


# -- choosing a context ---------------------------------------------------------------


def test_the_current_context_gives_its_cluster_server_and_user(tmp_path: Path) -> None:
    path = write_yaml(
        tmp_path / "config", kubeconfig({"server": "https://dev.example:6443/"}, {"token": TOKEN})
    )

    config = load_kubeconfig(path)

    assert config.context == "dev"
    assert config.cluster_name == "dev"
    assert config.user_name == "dev"
    assert config.server == "https://dev.example:6443"  # the trailing slash is dropped
    assert config.user["token"] == TOKEN
    assert config.auth_kind == "token"
    assert config.origin == str(tmp_path / "config")


def test_each_of_several_contexts_loads_its_own_server_and_user() -> None:
    data: dict[str, Any] = {
        "clusters": [
            {"name": "east", "cluster": {"server": "https://east.example"}},
            {"name": "west", "cluster": {"server": "https://west.example"}},
        ],
        "users": [
            {"name": "alice", "user": {"token": "made-up-alice"}},
            {"name": "bob", "user": {"username": "bob", "password": "made-up-bob"}},
        ],
        "contexts": [
            {"name": "east-alice", "context": {"cluster": "east", "user": "alice"}},
            {"name": "west-bob", "context": {"cluster": "west", "user": "bob"}},
        ],
        "current-context": "east-alice",
    }

    east = kubeconfig_from_dict(data, "east-alice")
    west = kubeconfig_from_dict(data, "west-bob")

    assert (east.context, east.server, east.user_name, east.auth_kind) == (
        "east-alice",
        "https://east.example",
        "alice",
        "token",
    )
    assert (west.context, west.server, west.user_name, west.auth_kind) == (
        "west-bob",
        "https://west.example",
        "bob",
        "basic",
    )


def test_a_named_context_overrides_the_current_context() -> None:
    data = kubeconfig({"server": "https://dev.example"})
    data["clusters"].append({"name": "ops", "cluster": {"server": "https://ops.example"}})
    data["contexts"].append({"name": "ops", "context": {"cluster": "ops"}})

    assert kubeconfig_from_dict(data, "ops").server == "https://ops.example"


def test_a_context_without_a_user_has_no_credentials() -> None:
    config = kubeconfig_from_dict(kubeconfig({"server": "https://dev.example"}))

    assert config.user_name is None
    assert config.user == {}
    assert config.auth_kind == "none"


def test_an_unknown_context_is_an_error_listing_the_available_contexts() -> None:
    data = kubeconfig({"server": "https://dev.example"})
    data["contexts"].append({"name": "staging", "context": {"cluster": "dev"}})

    with pytest.raises(KubeconfigError, match="context 'prod' not found") as caught:
        kubeconfig_from_dict(data, "prod")

    assert "contexts: 'dev', 'staging'" in str(caught.value)


def test_no_current_context_and_none_named_is_an_error_listing_the_contexts() -> None:
    data = kubeconfig({"server": "https://dev.example"}, current=False)

    with pytest.raises(KubeconfigError, match="no current-context") as caught:
        kubeconfig_from_dict(data)

    assert "contexts: 'dev'" in str(caught.value)


def test_a_missing_user_entry_is_an_error_naming_the_user_and_the_context() -> None:
    data = kubeconfig({"server": "https://dev.example"}, {"token": TOKEN})
    data["contexts"][0]["context"]["user"] = "ghost"

    with pytest.raises(KubeconfigError, match="user entry 'ghost' not found") as caught:
        kubeconfig_from_dict(data)

    assert caught.value.context == "dev"
    assert "context 'dev'" in str(caught.value)


def test_a_missing_cluster_entry_is_an_error_naming_the_cluster_and_the_context() -> None:
    data = kubeconfig({"server": "https://dev.example"})
    data["contexts"][0]["context"]["cluster"] = "nowhere"

    with pytest.raises(KubeconfigError, match="cluster entry 'nowhere' not found") as caught:
        kubeconfig_from_dict(data)

    assert caught.value.context == "dev"


def test_a_context_naming_no_cluster_is_an_error() -> None:
    data = kubeconfig({"server": "https://dev.example"})
    del data["contexts"][0]["context"]["cluster"]

    with pytest.raises(KubeconfigError, match="names no cluster"):
        kubeconfig_from_dict(data)


def test_a_cluster_without_a_server_is_an_error() -> None:
    with pytest.raises(KubeconfigError, match="cluster 'dev' has no server"):
        kubeconfig_from_dict(kubeconfig({"certificate-authority-data": CA_DATA}))


def test_a_server_that_is_not_an_http_url_is_an_error() -> None:
    with pytest.raises(KubeconfigError, match="must be an http"):
        kubeconfig_from_dict(kubeconfig({"server": "dev.example:6443"}))


def test_a_server_that_does_not_parse_as_a_url_is_a_kubeconfig_error() -> None:
    with pytest.raises(KubeconfigError, match="must be an http"):
        kubeconfig_from_dict(kubeconfig({"server": "https://[fd00::1:6443"}))


def test_a_context_user_that_is_not_a_name_is_a_kubeconfig_error() -> None:
    data = kubeconfig({"server": "https://dev.example"}, {"token": TOKEN})
    data["contexts"][0]["context"]["user"] = {"token": TOKEN}

    with pytest.raises(KubeconfigError, match="the context's user must be a name") as caught:
        kubeconfig_from_dict(data)

    assert_no_secret(str(caught.value))


def test_an_entry_without_a_name_is_an_error_naming_the_section() -> None:
    data = kubeconfig({"server": "https://dev.example"})
    data["users"].append({"user": {"token": TOKEN}})

    with pytest.raises(KubeconfigError, match=r"users\[0\] has no name"):
        kubeconfig_from_dict(data)


def test_a_section_that_is_not_a_list_is_an_error() -> None:
    data = kubeconfig({"server": "https://dev.example"})
    data["clusters"] = {"dev": {"server": "https://dev.example"}}

    with pytest.raises(KubeconfigError, match="'clusters' must be a list"):
        kubeconfig_from_dict(data)


def test_the_first_entry_of_a_repeated_name_wins_within_one_file() -> None:
    data = kubeconfig({"server": "https://first.example"})
    data["clusters"].append({"name": "dev", "cluster": {"server": "https://second.example"}})

    assert kubeconfig_from_dict(data).server == "https://first.example"


def test_list_contexts_gives_the_context_names_in_file_order() -> None:
    data: dict[str, Any] = {
        "contexts": [
            {"name": "zeta", "context": {}},
            {"context": {}},  # nameless entries are skipped
            {"name": "alpha", "context": {}},
        ]
    }

    assert list_contexts(data) == ["zeta", "alpha"]
    assert list_contexts({}) == []


# -- file references ------------------------------------------------------------------


def test_a_relative_ca_path_resolves_against_the_kubeconfig_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "home"
    ca = write_file(home / "certs" / "ca.crt")
    path = write_yaml(
        home / "config",
        kubeconfig({"server": "https://dev.example", "certificate-authority": "certs/ca.crt"}),
    )
    elsewhere = tmp_path / "elsewhere"
    write_file(elsewhere / "certs" / "ca.crt", "a decoy in the working directory\n")
    monkeypatch.chdir(elsewhere)

    config = load_kubeconfig(path)

    assert config.cluster["certificate-authority"] == str(ca)


def test_relative_client_certificate_and_key_resolve_against_the_kubeconfig_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "home"
    cert = write_file(home / "pki" / "client.crt")
    key = write_file(home / "pki" / "client.key")
    user = {"client-certificate": "pki/client.crt", "client-key": "./pki/client.key"}
    path = write_yaml(home / "config", kubeconfig({"server": "https://dev.example"}, user))
    monkeypatch.chdir(tmp_path)

    config = load_kubeconfig(path)

    assert config.user["client-certificate"] == str(cert)
    assert config.user["client-key"] == str(key)
    assert config.auth_kind == "client-certificate"


def test_a_relative_token_file_resolves_against_the_kubeconfig_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "home"
    token = write_file(home / "secrets" / "token", TOKEN)
    path = write_yaml(
        home / "config", kubeconfig({"server": "https://dev.example"}, {"tokenFile": "secrets/token"})
    )
    elsewhere = tmp_path / "elsewhere"
    write_file(elsewhere / "secrets" / "token", "a decoy token\n")
    monkeypatch.chdir(elsewhere)

    config = load_kubeconfig(path)

    assert config.user["tokenFile"] == str(token)
    assert config.auth_kind == "token"


def test_an_absolute_path_is_kept_as_it_is(tmp_path: Path) -> None:
    ca = write_file(tmp_path / "pki" / "ca.crt")
    path = write_yaml(
        tmp_path / "conf" / "config",
        kubeconfig({"server": "https://dev.example", "certificate-authority": str(ca)}),
    )

    assert load_kubeconfig(path).cluster["certificate-authority"] == str(ca)


def test_a_relative_path_in_a_dict_without_base_dir_is_an_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_file(tmp_path / "ca.crt")
    monkeypatch.chdir(tmp_path)  # the file exists relative to the CWD, and that must not matter
    data = kubeconfig({"server": "https://dev.example", "certificate-authority": "ca.crt"})

    with pytest.raises(KubeconfigError, match="relative path") as caught:
        kubeconfig_from_dict(data)

    assert "certificate-authority" in str(caught.value)
    assert "base_dir" in str(caught.value)


def test_a_relative_path_in_a_dict_resolves_against_base_dir(tmp_path: Path) -> None:
    ca = write_file(tmp_path / "ca.crt")
    data = kubeconfig({"server": "https://dev.example", "certificate-authority": "ca.crt"})

    config = kubeconfig_from_dict(data, base_dir=tmp_path)

    assert config.cluster["certificate-authority"] == str(ca)


@pytest.mark.parametrize(
    ("section", "field_name"),
    [
        ("cluster", "certificate-authority"),
        ("user", "client-certificate"),
        ("user", "client-key"),
        ("user", "tokenFile"),
    ],
)
def test_a_missing_referenced_file_is_an_error_naming_the_field_and_the_path(
    tmp_path: Path, section: str, field_name: str
) -> None:
    cluster: dict[str, Any] = {"server": "https://dev.example"}
    user: dict[str, Any] = {}
    if field_name in ("client-certificate", "client-key"):
        # the other half of the pair exists, so only the named file is missing
        user = {"client-certificate-data": CERT_DATA, "client-key-data": KEY_DATA}
        user.pop(f"{field_name}-data")
    (cluster if section == "cluster" else user)[field_name] = "missing/file.pem"
    path = write_yaml(tmp_path / "config", kubeconfig(cluster, user))

    with pytest.raises(KubeconfigError) as caught:
        load_kubeconfig(path)

    message = str(caught.value)
    assert f"{field_name} file {tmp_path / 'missing' / 'file.pem'} does not exist" in message
    assert str(path) in message


def test_a_referenced_file_name_too_long_to_look_up_is_an_error_naming_the_field(tmp_path: Path) -> None:
    # Found by the fuzzer: a 256-character file name makes stat() fail (ENAMETOOLONG),
    # which Path.is_file() passes on instead of answering False.
    user = {"client-certificate": "x" * 256, "client-key-data": KEY_DATA}
    path = write_yaml(tmp_path / "config", kubeconfig({"server": "https://dev.example"}, user))

    with pytest.raises(KubeconfigError) as caught:
        load_kubeconfig(path)

    message = str(caught.value)
    assert "client-certificate file " in message and "cannot be looked up: File name too long" in message
    assert f"({len(str(tmp_path / ('x' * 256)))} characters)" in message
    assert str(path) in message


def test_a_referenced_file_name_with_a_nul_byte_does_not_exist(tmp_path: Path) -> None:
    user = {"client-certificate": "cert\x00.pem", "client-key-data": KEY_DATA}
    path = write_yaml(tmp_path / "config", kubeconfig({"server": "https://dev.example"}, user))

    with pytest.raises(KubeconfigError, match=r"client-certificate file .* does not exist"):
        load_kubeconfig(path)


def test_an_empty_path_field_is_an_error_naming_the_field() -> None:
    with pytest.raises(KubeconfigError, match="certificate-authority must be a non-empty path"):
        kubeconfig_from_dict(kubeconfig({"server": "https://dev.example", "certificate-authority": ""}))


def test_inline_data_wins_over_a_file_reference() -> None:
    cluster = {
        "server": "https://dev.example",
        "certificate-authority": "/nonexistent/ca.crt",
        "certificate-authority-data": CA_DATA,
    }

    config = kubeconfig_from_dict(kubeconfig(cluster))

    assert "certificate-authority" not in config.cluster
    assert config.cluster["certificate-authority-data"] == CA_DATA


def test_an_inline_token_wins_over_a_token_file() -> None:
    config = kubeconfig_from_dict(
        kubeconfig({"server": "https://dev.example"}, {"token": TOKEN, "tokenFile": "relative/and/missing"})
    )

    assert config.user["token"] == TOKEN


def test_a_kubeconfig_mounted_from_a_secret_keeps_valid_paths_after_the_kubelet_swaps_it(
    tmp_path: Path,
) -> None:
    # The kubelet's layout for a mounted Secret: each key is a symlink through ..data
    # into a timestamped directory, and an update swaps ..data and deletes the old one.
    mount = tmp_path / "mount"
    first = mount / "..2024_01_01_00_00_00.1"
    write_yaml(first / "config", kubeconfig({"server": "https://dev.example"}, {"tokenFile": "token"}))
    write_file(first / "token", "made-up-first-token")
    (mount / "..data").symlink_to(first.name)
    (mount / "config").symlink_to("..data/config")
    (mount / "token").symlink_to("..data/token")

    config = load_kubeconfig(mount / "config")

    second = mount / "..2024_01_02_00_00_00.2"
    shutil.copytree(first, second)
    write_file(second / "token", "made-up-second-token")
    (mount / "..data_tmp").symlink_to(second.name)
    os.replace(mount / "..data_tmp", mount / "..data")
    shutil.rmtree(first)

    assert config.user["tokenFile"] == str(mount / "token")
    assert Path(config.user["tokenFile"]).read_text() == "made-up-second-token"


# -- inline data ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("section", "data_field"),
    [
        ("cluster", "certificate-authority-data"),
        ("user", "client-certificate-data"),
        ("user", "client-key-data"),
    ],
)
def test_invalid_base64_in_a_data_field_is_an_error_naming_the_field(section: str, data_field: str) -> None:
    cluster: dict[str, Any] = {"server": "https://dev.example"}
    user: dict[str, Any] = {"client-certificate-data": CERT_DATA, "client-key-data": KEY_DATA}
    (cluster if section == "cluster" else user)[data_field] = "this is *not* base64!"

    with pytest.raises(KubeconfigError, match=f"{data_field} is not valid base64"):
        kubeconfig_from_dict(kubeconfig(cluster, user))


def test_line_wrapped_base64_is_accepted_as_kubectl_accepts_it() -> None:
    wrapped = "\n".join(CA_DATA[i : i + 20] for i in range(0, len(CA_DATA), 20)) + "\n"

    config = kubeconfig_from_dict(
        kubeconfig({"server": "https://dev.example", "certificate-authority-data": wrapped})
    )

    assert base64.b64decode(config.cluster["certificate-authority-data"]) == base64.b64decode(CA_DATA)


def test_a_client_certificate_without_a_key_is_an_error() -> None:
    with pytest.raises(KubeconfigError, match="user 'dev' has no client-key"):
        kubeconfig_from_dict(
            kubeconfig({"server": "https://dev.example"}, {"client-certificate-data": CERT_DATA})
        )


def test_a_client_key_without_a_certificate_is_an_error() -> None:
    with pytest.raises(KubeconfigError, match="user 'dev' has no client-certificate"):
        kubeconfig_from_dict(kubeconfig({"server": "https://dev.example"}, {"client-key-data": KEY_DATA}))


# -- trust ----------------------------------------------------------------------------

EXEC = {
    "apiVersion": "client.authentication.k8s.io/v1",
    "command": "made-up-credential-helper",
    "args": ["token"],
}
AUTH_PROVIDER = {"name": "oidc", "config": {"client-id": "made-up-client", "id-token": TOKEN}}


def test_trust_policy_error_is_a_kubeconfig_error() -> None:
    assert issubclass(TrustPolicyError, KubeconfigError)
    assert issubclass(KubeconfigError, MCRuntimeError)


def test_the_policies_own_and_untrusted_allow_everything_and_nothing() -> None:
    assert TrustPolicy.own() == TrustPolicy(
        allow_exec=True, allow_auth_provider=True, allow_insecure=True, allow_local_files=True
    )
    assert TrustPolicy.untrusted() == TrustPolicy()
    assert not any(
        (
            TrustPolicy().allow_exec,
            TrustPolicy().allow_auth_provider,
            TrustPolicy().allow_insecure,
            TrustPolicy().allow_local_files,
        )
    )


def test_exec_is_refused_by_the_untrusted_policy() -> None:
    data = kubeconfig({"server": "https://dev.example"}, {"exec": EXEC})

    with pytest.raises(TrustPolicyError, match="exec plugin") as caught:
        kubeconfig_from_dict(data, trust=TrustPolicy.untrusted())

    assert "allow_exec=True" in str(caught.value)
    assert caught.value.context == "dev"


def test_exec_is_accepted_by_the_own_policy(tmp_path: Path) -> None:
    path = write_yaml(tmp_path / "config", kubeconfig({"server": "https://dev.example"}, {"exec": EXEC}))

    config = load_kubeconfig(path, trust=TrustPolicy.own())

    assert config.auth_kind == "exec"
    assert config.user["exec"]["command"] == "made-up-credential-helper"
    assert config.user["exec"]["_base_dir"] == str(tmp_path)  # relative commands resolve there


def test_an_exec_entry_that_is_not_a_mapping_is_an_error() -> None:
    data = kubeconfig({"server": "https://dev.example"}, {"exec": "made-up-credential-helper"})

    with pytest.raises(KubeconfigError, match="exec must be a mapping"):
        kubeconfig_from_dict(data, base_dir="/", trust=TrustPolicy.own())


def test_allowing_exec_alone_does_not_allow_an_auth_provider() -> None:
    data = kubeconfig({"server": "https://dev.example"}, {"auth-provider": AUTH_PROVIDER})

    with pytest.raises(TrustPolicyError, match="auth-provider"):
        kubeconfig_from_dict(data, trust=TrustPolicy(allow_exec=True))


def test_an_auth_provider_is_refused_by_the_untrusted_policy() -> None:
    data = kubeconfig({"server": "https://dev.example"}, {"auth-provider": AUTH_PROVIDER})

    with pytest.raises(TrustPolicyError, match="allow_auth_provider=True"):
        kubeconfig_from_dict(data)


def test_an_auth_provider_is_accepted_by_the_own_policy() -> None:
    data = kubeconfig({"server": "https://dev.example"}, {"auth-provider": AUTH_PROVIDER})

    assert kubeconfig_from_dict(data, trust=TrustPolicy.own()).auth_kind == "auth-provider"


def test_insecure_skip_tls_verify_is_refused_unless_allow_insecure() -> None:
    data = kubeconfig({"server": "https://dev.example", "insecure-skip-tls-verify": True})

    with pytest.raises(TrustPolicyError, match="insecure-skip-tls-verify"):
        kubeconfig_from_dict(data, trust=TrustPolicy(allow_exec=True, allow_auth_provider=True))
    config = kubeconfig_from_dict(data, trust=TrustPolicy(allow_insecure=True))
    assert config.insecure


def test_plain_http_is_refused_unless_allow_insecure() -> None:
    data = kubeconfig({"server": "http://dev.example:8080"})

    with pytest.raises(TrustPolicyError, match="plain HTTP"):
        kubeconfig_from_dict(data)
    config = kubeconfig_from_dict(data, trust=TrustPolicy(allow_insecure=True))
    assert config.insecure


def test_a_verified_https_cluster_is_not_insecure() -> None:
    assert not kubeconfig_from_dict(kubeconfig({"server": "https://dev.example"})).insecure


def test_a_file_loads_with_the_own_policy_by_default(tmp_path: Path) -> None:
    path = write_yaml(tmp_path / "config", kubeconfig({"server": "https://dev.example"}, {"exec": EXEC}))

    assert load_kubeconfig(path).trust == TrustPolicy.own()


def test_a_dict_loads_with_the_untrusted_policy_by_default() -> None:
    config = kubeconfig_from_dict(kubeconfig({"server": "https://dev.example"}))

    assert config.trust == TrustPolicy.untrusted()
    with pytest.raises(TrustPolicyError):
        kubeconfig_from_dict(kubeconfig({"server": "https://dev.example"}, {"exec": EXEC}))
