"""Kubeconfig safety: secrets stay out of reprs and messages, fingerprints follow content, cost is bounded."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from test_kubeconfig import (
    AUTH_PROVIDER,
    CA_DATA,
    CERT_DATA,
    EXEC,
    KEY_DATA,
    PASSWORD,
    TOKEN,
    assert_no_secret,
    kubeconfig,
    write_file,
    write_yaml,
)

from mcruntime._base.errors import KubeconfigError
from mcruntime._config.kubeconfig import (
    TrustPolicy,
    kubeconfig_from_dict,
    kubeconfig_from_yaml,
    load_kubeconfig,
    load_kubeconfig_async,
)

# -- secrets stay secret --------------------------------------------------------------


def secret_kubeconfig() -> dict[str, Any]:
    """A kubeconfig whose one user carries every kind of static secret."""
    user = {
        "token": TOKEN,
        "username": "admin",
        "password": PASSWORD,
        "client-certificate-data": CERT_DATA,
        "client-key-data": KEY_DATA,
    }
    return kubeconfig(
        {"server": "https://prod.example:6443", "certificate-authority-data": CA_DATA}, user, name="prod"
    )


def test_repr_and_str_of_a_cluster_config_hold_no_secret() -> None:
    config = kubeconfig_from_dict(secret_kubeconfig())

    assert config.user["password"] == PASSWORD  # the secrets are there...
    for text in (repr(config), str(config), f"{config}", repr([config])):
        assert_no_secret(text)  # ...and never shown
        assert "https://prod.example:6443" in text
        assert "'prod'" in text


@pytest.mark.parametrize(
    "server",
    [
        f"https://admin:{PASSWORD}@prod.example:6443",
        f"https://{PASSWORD}@prod.example",
        f"http://a:{PASSWORD}@h",
    ],
)
def test_a_server_url_with_userinfo_is_refused_without_echoing_it(server: str) -> None:
    data = kubeconfig({"server": server}, {"token": TOKEN})

    with pytest.raises(KubeconfigError, match="user name or password, which is refused") as caught:
        kubeconfig_from_dict(data, trust=TrustPolicy.own())

    assert PASSWORD not in str(caught.value)
    assert PASSWORD not in repr(caught.value)


def _unknown_context(data: dict[str, Any]) -> None:
    data["current-context"] = "missing"


def _missing_cluster(data: dict[str, Any]) -> None:
    data["contexts"][0]["context"]["cluster"] = "missing"


def _missing_user(data: dict[str, Any]) -> None:
    data["contexts"][0]["context"]["user"] = "missing"


def _no_server(data: dict[str, Any]) -> None:
    del data["clusters"][0]["cluster"]["server"]


def _exec(data: dict[str, Any]) -> None:
    data["users"][0]["user"]["exec"] = dict(EXEC, env=[{"name": "TOKEN", "value": TOKEN}])


def _auth_provider(data: dict[str, Any]) -> None:
    data["users"][0]["user"]["auth-provider"] = AUTH_PROVIDER


def _insecure(data: dict[str, Any]) -> None:
    data["clusters"][0]["cluster"]["insecure-skip-tls-verify"] = True


def _bad_key_data(data: dict[str, Any]) -> None:
    data["users"][0]["user"]["client-key-data"] = f"{TOKEN}!{PASSWORD}"


def _no_key(data: dict[str, Any]) -> None:
    del data["users"][0]["user"]["client-key-data"]


def _missing_ca_file(data: dict[str, Any]) -> None:
    del data["clusters"][0]["cluster"]["certificate-authority-data"]
    data["clusters"][0]["cluster"]["certificate-authority"] = "/nonexistent/ca.crt"


def _user_not_a_mapping(data: dict[str, Any]) -> None:
    data["users"][0]["user"] = TOKEN


def _user_without_a_name(data: dict[str, Any]) -> None:
    data["users"][0] = {"user": {"token": TOKEN, "password": PASSWORD}}


def _bad_scheme(data: dict[str, Any]) -> None:
    data["clusters"][0]["cluster"]["server"] = f"ftp://admin:{PASSWORD}@prod.example"


def _no_scheme(data: dict[str, Any]) -> None:
    data["clusters"][0]["cluster"]["server"] = f"admin:{PASSWORD}@prod.example:6443"


@pytest.mark.parametrize(
    "break_it",
    [
        _unknown_context,
        _missing_cluster,
        _missing_user,
        _no_server,
        _exec,
        _auth_provider,
        _insecure,
        _bad_key_data,
        _no_key,
        _missing_ca_file,
        _user_not_a_mapping,
        _user_without_a_name,
        _bad_scheme,
        _no_scheme,
    ],
)
def test_no_kubeconfig_error_message_holds_a_secret(break_it: Callable[[dict[str, Any]], None]) -> None:
    data = secret_kubeconfig()
    break_it(data)

    with pytest.raises(KubeconfigError) as caught:
        kubeconfig_from_dict(data)

    assert_no_secret(str(caught.value))
    assert_no_secret(repr(caught.value))
    assert caught.value.__cause__ is None


def test_a_yaml_error_does_not_quote_the_line_holding_a_secret(tmp_path: Path) -> None:
    path = write_file(
        tmp_path / "config", f"users:\n- name: me\n  user: {{token: {TOKEN}, password: [{PASSWORD}\n"
    )

    with pytest.raises(KubeconfigError) as caught:
        load_kubeconfig(path)

    assert_no_secret(str(caught.value))
    assert caught.value.__suppress_context__


# -- fingerprints ---------------------------------------------------------------------


def test_fingerprints_are_equal_for_equal_content(tmp_path: Path) -> None:
    write_file(tmp_path / "ca.crt", "made-up ca\n")
    data = kubeconfig({"server": "https://dev.example", "certificate-authority": "ca.crt"}, {"token": TOKEN})
    path = write_yaml(tmp_path / "config", data)

    from_file = load_kubeconfig(path)
    again = load_kubeconfig(path)
    from_dict = kubeconfig_from_dict(data, base_dir=tmp_path, trust=TrustPolicy.own())

    assert from_file.fingerprint() == again.fingerprint() == from_dict.fingerprint()
    assert from_file.endpoint_fingerprint() == from_dict.endpoint_fingerprint()
    assert from_file.credential_fingerprint() == from_dict.credential_fingerprint()


def test_a_rotated_token_changes_the_credential_fingerprint_but_not_the_endpoint() -> None:
    before = kubeconfig_from_dict(kubeconfig({"server": "https://dev.example"}, {"token": TOKEN}))
    after = kubeconfig_from_dict(kubeconfig({"server": "https://dev.example"}, {"token": TOKEN + "-rotated"}))

    assert after.endpoint_fingerprint() == before.endpoint_fingerprint()
    assert after.credential_fingerprint() != before.credential_fingerprint()
    assert after.fingerprint() != before.fingerprint()


def test_a_moved_server_changes_the_endpoint_fingerprint_but_not_the_credential() -> None:
    before = kubeconfig_from_dict(kubeconfig({"server": "https://old.example"}, {"token": TOKEN}))
    after = kubeconfig_from_dict(kubeconfig({"server": "https://new.example"}, {"token": TOKEN}))

    assert after.endpoint_fingerprint() != before.endpoint_fingerprint()
    assert after.credential_fingerprint() == before.credential_fingerprint()


def test_rewriting_a_referenced_ca_file_in_place_changes_the_fingerprint(tmp_path: Path) -> None:
    ca = write_file(tmp_path / "ca.crt", "made-up ca, first issue\n")
    path = write_yaml(
        tmp_path / "config", kubeconfig({"server": "https://dev.example", "certificate-authority": "ca.crt"})
    )
    before = load_kubeconfig(path)
    fingerprint = before.fingerprint()

    ca.write_text("made-up ca, second issue\n")
    after = load_kubeconfig(path)

    assert after.cluster == before.cluster  # the same path...
    assert after.fingerprint() != fingerprint  # ...with new content
    # Hashed at load (fingerprint() runs on the event loop and must not read files):
    # the old config keeps describing what it was loaded from.
    assert before.fingerprint() == fingerprint


def test_rewriting_a_referenced_client_key_in_place_changes_the_credential_fingerprint(
    tmp_path: Path,
) -> None:
    write_file(tmp_path / "client.crt")
    key = write_file(tmp_path / "client.key", "made-up key, first\n")
    user = {"client-certificate": "client.crt", "client-key": "client.key"}
    path = write_yaml(tmp_path / "config", kubeconfig({"server": "https://dev.example"}, user))
    before = load_kubeconfig(path).credential_fingerprint()

    key.write_text("made-up key, second\n")

    assert load_kubeconfig(path).credential_fingerprint() != before


def test_rewriting_a_token_file_in_place_keeps_the_fingerprint(tmp_path: Path) -> None:
    token = write_file(tmp_path / "token", "made-up-token-one")
    path = write_yaml(
        tmp_path / "config", kubeconfig({"server": "https://dev.example"}, {"tokenFile": "token"})
    )
    before = load_kubeconfig(path).fingerprint()

    token.write_text("made-up-token-two")  # the transport re-reads it; nothing to re-engage

    assert load_kubeconfig(path).fingerprint() == before


def test_a_cluster_config_is_immutable() -> None:
    config = kubeconfig_from_dict(kubeconfig({"server": "https://dev.example"}))

    with pytest.raises(AttributeError):
        config.origin = "elsewhere"  # type: ignore[misc]
    assert config.origin == "<kubeconfig dict>"


# --- wrong types, bounded cost, loop safety ------------------------------------------


@pytest.mark.parametrize(
    ("cluster", "user", "message"),
    [
        ({"server": 6443}, None, "cluster 'dev' has no server"),
        ({"server": "https://dev.example", "certificate-authority-data": 12}, None, "must be a string"),
        ({"server": "https://dev.example", "insecure-skip-tls-verify": "yes"}, None, "must be true or false"),
        ({"server": "https://dev.example"}, {"token": ["a", "b"]}, "user 'dev': token must be a string"),
        ({"server": "https://dev.example"}, {"password": 1234}, "user 'dev': password must be a string"),
        ({"server": "https://dev.example"}, {"exec": dict(EXEC, args="token")}, "exec.args must be a list"),
        ({"server": "https://dev.example"}, {"exec": dict(EXEC, command=None)}, "exec.command must be"),
        ({"server": "https://dev.example"}, {"exec": dict(EXEC, env=[{"name": 1}])}, "exec.env must be"),
        (
            {"server": "https://dev.example"},
            {"exec": dict(EXEC, interactiveMode="Always")},
            "needs a terminal",
        ),
        ({"server": "https://dev.example:port"}, None, "server must be an http\\(s\\) URL"),
    ],
)
def test_wrong_types_are_kubeconfig_errors_naming_the_field(
    cluster: dict[str, Any], user: dict[str, Any] | None, message: str
) -> None:
    with pytest.raises(KubeconfigError, match=message) as caught:
        kubeconfig_from_dict(kubeconfig(cluster, user), trust=TrustPolicy.own())
    assert caught.value.context == "dev"


def test_the_fingerprint_never_reads_files_after_load(tmp_path: Path) -> None:
    ca = write_file(tmp_path / "ca.crt", "made-up ca\n")
    config = load_kubeconfig(
        write_yaml(
            tmp_path / "config",
            kubeconfig({"server": "https://dev.example", "certificate-authority": "ca.crt"}),
        )
    )
    fingerprint = config.fingerprint()

    ca.unlink()  # were the file read on each call, the fingerprint would change now

    assert config.fingerprint() == fingerprint


async def test_loading_off_the_event_loop_gives_the_same_config(tmp_path: Path) -> None:
    path = write_yaml(tmp_path / "config", kubeconfig({"server": "https://dev.example"}, {"token": TOKEN}))

    config = await load_kubeconfig_async(path)

    assert config.fingerprint() == load_kubeconfig(path).fingerprint()
    assert config.origin == str(path)


def test_anchors_without_aliases_are_accepted() -> None:
    text = yaml.safe_dump(kubeconfig({"server": "https://dev.example"})).replace(
        "clusters:", "clusters: &all", 1
    )

    assert kubeconfig_from_yaml(text).server == "https://dev.example"
