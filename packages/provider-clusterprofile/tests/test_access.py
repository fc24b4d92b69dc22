"""The provider file and the reading of one profile: pure logic, no cluster."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest

import mcruntime as mcr
from mcruntime_clusterprofile import (
    ADDITIONAL_ARGS_EXTENSION,
    ADDITIONAL_ENVS_EXTENSION,
    EXEC_EXTENSION,
    AccessConfig,
    AccessConfigError,
    ArgsPolicy,
    EnvPolicy,
    ProfileError,
    control_plane_healthy,
)
from mcruntime_clusterprofile._access import exec_for
from mcruntime_clusterprofile._profile import Limits, read_access

TRUST = mcr.TrustPolicy(allow_exec=True)
CA = base64.b64encode(b"-----BEGIN CERTIFICATE-----\nx\n-----END CERTIFICATE-----\n").decode()


def provider_file(**entry: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "name": "p",
        "execConfig": {
            "apiVersion": "client.authentication.k8s.io/v1",
            "command": "/bin/plugin",
            "args": ["--mode", "token"],
            "env": [{"name": "A", "value": "file"}, {"name": "B", "value": "file"}],
        },
    }
    base.update(entry)
    return {"providers": [base]}


def profile(*entries: dict[str, Any], field: str = "accessProviders", **status: Any) -> dict[str, Any]:
    return {"metadata": {"name": "m", "namespace": "ns"}, "status": {field: list(entries), **status}}


def entry(name: str = "p", server: str = "https://10.0.0.1:6443", /, **cluster: Any) -> dict[str, Any]:
    return {"name": name, "cluster": {"server": server, "certificate-authority-data": CA, **cluster}}


def read(document: dict[str, Any], access: AccessConfig | None = None, /, **limits: int) -> mcr.ClusterConfig:
    config = access or AccessConfig.from_dict(provider_file(), origin="providers.json")
    return read_access("ns/m", document, config, trust=TRUST, limits=Limits(**limits)).config


# --- the provider file -------------------------------------------------------------------


def test_the_go_tooling_file_shape_is_read(tmp_path: Path) -> None:
    path = tmp_path / "providers.json"
    path.write_text(
        json.dumps(
            provider_file(
                profileSourcedCLIArgsPolicy="Append", profileSourcedEnvVarsPolicy="AppendIfNotExists"
            )
        )
    )
    config = AccessConfig.load(path)
    assert config.names() == ["p"]
    assert config.providers[0].args_policy is ArgsPolicy.APPEND
    assert config.providers[0].env_policy is EnvPolicy.APPEND_IF_NOT_EXISTS
    assert config.base_dir is None  # a relative command is the working directory's, as in Go
    secret = AccessConfig.from_dict(
        provider_file(
            execConfig={
                **provider_file()["providers"][0]["execConfig"],
                "env": [{"name": "K", "value": "s3cr3t"}],
            }
        )
    )
    assert "s3cr3t" not in repr(secret)  # the plugin's environment stays out of reprs


@pytest.mark.parametrize(
    ("document", "message"),
    [
        ([], "the top level is not an object"),
        ({"providers": []}, "providers must be a non-empty list"),
        ({"providers": [{"execConfig": {}}]}, r"providers\[0\]\.name must be a non-empty string"),
        (provider_file(execConfig=None), r"providers\[0\] \('p'\)\.execConfig must be an object"),
        (
            provider_file(execConfig={"command": "x", "apiVersion": "v9"}),
            r"execConfig\.apiVersion must be one of",
        ),
        (
            provider_file(profileSourcedCLIArgsPolicy="Prepend"),
            r"profileSourcedCLIArgsPolicy 'Prepend' is not one of Ignore, Append",
        ),
        (
            provider_file(profileSourcedEnvVarsPolicy="Merge"),
            "profileSourcedEnvVarsPolicy 'Merge' is not one of",
        ),
        ({"providers": [provider_file()["providers"][0]] * 2}, "'p' is listed twice"),
    ],
)
def test_a_broken_file_names_itself_and_the_field(document: Any, message: str) -> None:
    with pytest.raises(AccessConfigError, match=message) as raised:
        AccessConfig.from_dict(document, origin="providers.json")
    assert str(raised.value).startswith("providers.json: ")


def test_an_unreadable_or_invalid_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(AccessConfigError, match="cannot read the provider file"):
        AccessConfig.load(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{\n  nope")
    with pytest.raises(AccessConfigError, match=r"bad\.json: not valid JSON at line 2"):
        AccessConfig.load(bad)


# --- KEP-5339 policies -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args_policy", "env_policy", "args", "env"),
    [
        ("Ignore", "Ignore", ["--mode", "token"], {"A": "file", "B": "file"}),
        (
            "Append",
            "AppendIfNotExists",
            ["--mode", "token", "--tenant", "t1"],
            {"A": "file", "B": "file", "C": "p"},
        ),
        ("Append", "Replace", ["--mode", "token", "--tenant", "t1"], {"A": "profile", "B": "file", "C": "p"}),
    ],
)
def test_profile_sourced_args_and_env_follow_the_policies(
    args_policy: str, env_policy: str, args: list[str], env: dict[str, str]
) -> None:
    config = AccessConfig.from_dict(
        provider_file(profileSourcedCLIArgsPolicy=args_policy, profileSourcedEnvVarsPolicy=env_policy)
    )
    spec = exec_for(config.providers[0], ["--tenant", "t1"], {"C": "p", "A": "profile"})
    assert spec["args"] == args
    assert {item["name"]: item["value"] for item in spec["env"]} == env
    assert [item["name"] for item in spec["env"]][:2] == ["A", "B"]  # file order first, then sorted
    assert spec["interactiveMode"] == "Never"


def test_the_profile_reaches_the_plugin_only_through_the_policies() -> None:
    access = AccessConfig.from_dict(provider_file(profileSourcedCLIArgsPolicy="Append"))
    extensions = [
        {"name": ADDITIONAL_ARGS_EXTENSION, "extension": ["--cluster", "m"]},
        {"name": ADDITIONAL_ENVS_EXTENSION, "extension": {"A": "profile"}},
        {"name": EXEC_EXTENSION, "extension": {"clusterName": "m"}},
        {"name": "vendor.example/other", "extension": {"ignored": True}},
    ]
    config = read(profile(entry(extensions=extensions)), access)
    assert config.user["exec"]["args"] == ["--mode", "token", "--cluster", "m"]
    assert config.user["exec"]["env"] == [{"name": "A", "value": "file"}, {"name": "B", "value": "file"}]
    # Only the plugin's own extension stays with the cluster (handed to the plugin as its config).
    assert config.cluster["extensions"] == [{"name": EXEC_EXTENSION, "extension": {"clusterName": "m"}}]


def test_a_changed_credential_keeps_the_endpoint_and_a_changed_ca_does_not() -> None:
    access = AccessConfig.from_dict(provider_file(profileSourcedCLIArgsPolicy="Append"))
    one = read(profile(entry(extensions=[{"name": ADDITIONAL_ARGS_EXTENSION, "extension": ["a"]}])), access)
    two = read(profile(entry(extensions=[{"name": ADDITIONAL_ARGS_EXTENSION, "extension": ["b"]}])), access)
    assert one.endpoint_fingerprint() == two.endpoint_fingerprint()
    assert one.credential_fingerprint() != two.credential_fingerprint()
    other_ca = base64.b64encode(b"another").decode()
    moved = read(profile(entry(**{"certificate-authority-data": other_ca})), access)
    assert moved.endpoint_fingerprint() != one.endpoint_fingerprint()


# --- choosing an access provider ----------------------------------------------------------


def test_access_providers_win_and_the_consumer_order_decides() -> None:
    access = AccessConfig.from_dict(
        {"providers": [dict(provider_file()["providers"][0], name=n) for n in ("first", "second")]}
    )
    document = profile(entry("second", "https://second"), entry("first", "https://access"))
    document["status"]["credentialProviders"] = [entry("first", "https://deprecated")]
    chosen = read_access("ns/m", document, access, trust=TRUST, limits=Limits())
    assert chosen.provider == "first" and chosen.config.server == "https://access"
    only_old = profile(entry("second", "https://old"), field="credentialProviders")
    assert read(only_old, access).server == "https://old"


# --- bounds and clear errors --------------------------------------------------------------


@pytest.mark.parametrize(
    ("document", "limits", "message"),
    [
        (
            profile(entry("other")),
            {},
            r"offers no access provider this consumer supports \(offers 'other'; supported 'p'\)",
        ),
        (
            profile(*[entry(f"e{i}") for i in range(5)]),
            {"max_access_providers": 4},
            "lists more than 4 access providers",
        ),
        (
            profile(entry("p", "https://" + "h" * 100)),
            {"max_string_chars": 50},
            "cluster.server is longer than 50",
        ),
        (
            profile(entry(**{"certificate-authority-data": "not base64!"})),
            {},
            "certificate-authority-data is not valid base64",
        ),
        (
            profile(entry(**{"certificate-authority": "/etc/ssl/ca.pem"})),
            {},
            "certificate-authority .a file path. is refused",
        ),
        (profile(entry(**{"proxy-url": 7})), {}, "cluster.proxy-url must be a string"),
        (profile(entry("p", "")), {}, "cluster.server must be a non-empty string"),
        (profile({"name": "p"}), {}, "access provider 'p': cluster must be an object"),
        (profile("x"), {}, r"status.accessProviders\[0\] is not an object"),  # type: ignore[arg-type]
        (
            profile(entry(), extra="y" * 3000),
            {"max_profile_bytes": 2048},
            "more than the limit of 2048; not read",
        ),
        (
            profile(entry(extensions=[{"name": ADDITIONAL_ARGS_EXTENSION, "extension": {"not": "a list"}}])),
            {},
            "must be a list of strings",
        ),
        (
            profile(
                entry(extensions=[{"name": ADDITIONAL_ENVS_EXTENSION, "extension": {"A=B": "secret-value"}}])
            ),
            {},
            "a variable name is empty, too long or contains '='",
        ),
        (
            profile(
                entry(extensions=[{"name": ADDITIONAL_ENVS_EXTENSION, "extension": {"LD_PRELOAD": "/x.so"}}])
            ),
            {},
            "'LD_PRELOAD' is refused",
        ),
        (
            profile(entry(extensions=[{"name": ADDITIONAL_ARGS_EXTENSION, "extension": ["a"] * 65}])),
            {},
            "has more than 64 arguments",
        ),
    ],
)
def test_untrusted_profiles_are_bounded_and_errors_name_the_profile(
    document: dict[str, Any], limits: dict[str, int], message: str
) -> None:
    with pytest.raises(ProfileError, match=message) as raised:
        read(document, **limits)
    assert str(raised.value).startswith("ClusterProfile ns/m: ")
    assert "secret-value" not in str(raised.value)


def test_insecure_needs_the_trust_policy() -> None:
    document = profile(entry(**{"insecure-skip-tls-verify": True}))
    with pytest.raises(ProfileError, match="insecure-skip-tls-verify, which this trust policy refuses"):
        read(document)
    access = AccessConfig.from_dict(provider_file())
    trusted = read_access(
        "ns/m", document, access, trust=mcr.TrustPolicy(allow_exec=True, allow_insecure=True), limits=Limits()
    )
    assert trusted.config.insecure


def test_readiness_is_the_control_plane_healthy_condition() -> None:
    def with_condition(status: str, kind: str = "ControlPlaneHealthy") -> dict[str, Any]:
        return {"status": {"conditions": [{"type": kind, "status": status}]}}

    assert control_plane_healthy(with_condition("True"))
    assert not control_plane_healthy(with_condition("False"))
    assert not control_plane_healthy(with_condition("Unknown"))
    assert not control_plane_healthy(with_condition("True", kind="Joined"))
    assert not control_plane_healthy({"status": {}})
