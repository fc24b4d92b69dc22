"""An untrusted kubeconfig's file references: inside its own directory, regular, bounded, and never quoted as secrets.

A kubeconfig a provider reads (a file in a watched directory, a Secret) is
untrusted. Its ``tokenFile`` could name the controller's own ServiceAccount
token and send it, as a bearer token, to a server the kubeconfig chose; its
CA could be a FIFO or ``/dev/zero``. These are refused when the kubeconfig is
loaded, and a token file is checked again each time it is read.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import pytest

import mcruntime as mcr
from mcruntime._config.credentials import ClusterCredentials

SECRET = "eyJhbGciOiJSUzI1NiJ9.controllers-own-service-account-token.c2lnbmF0dXJl"


def _kubeconfig(**user: Any) -> dict[str, Any]:
    return {
        "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}],
        "users": [{"name": "u", "user": user}],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "x",
    }


@pytest.fixture
def own_token(tmp_path: Path) -> Path:
    """The controller's own token, outside any kubeconfig's directory."""
    where = tmp_path / "serviceaccount"
    where.mkdir()
    (where / "token").write_text(SECRET)
    return where / "token"


def test_a_secrets_kubeconfig_may_not_name_a_local_file(own_token: Path) -> None:
    with pytest.raises(mcr.TrustPolicyError) as refused:
        mcr.kubeconfig_from_dict(_kubeconfig(tokenFile=str(own_token)))
    assert (
        "tokenFile names a file and this kubeconfig, not read from a file, has no directory of its own"
        in str(refused.value)
    )
    assert "TrustPolicy(allow_local_files=True)" in str(refused.value)
    allowed = mcr.kubeconfig_from_dict(_kubeconfig(tokenFile=str(own_token)), trust=mcr.TrustPolicy.own())
    assert allowed.user["tokenFile"] == str(own_token)


def test_a_files_kubeconfig_may_name_files_beside_it_but_not_outside_even_through_a_link(
    tmp_path: Path, own_token: Path
) -> None:
    fleet = tmp_path / "fleet"
    fleet.mkdir()
    (fleet / "token").write_text("a-token-of-its-own")
    (fleet / "sneaky").symlink_to(own_token)
    beside = mcr.kubeconfig_from_dict(_kubeconfig(tokenFile="token"), base_dir=fleet)
    assert beside.user["tokenFile"] == str(fleet / "token")
    for reference in ("../serviceaccount/token", str(own_token), "sneaky"):
        with pytest.raises(mcr.TrustPolicyError, match="outside this kubeconfig's directory"):
            mcr.kubeconfig_from_dict(_kubeconfig(tokenFile=reference), base_dir=fleet)


async def test_a_token_file_swapped_for_a_link_outside_after_loading_is_not_read(
    tmp_path: Path, own_token: Path
) -> None:
    fleet = tmp_path / "fleet"
    fleet.mkdir()
    (fleet / "token").write_text("a-token-of-its-own")
    config = mcr.kubeconfig_from_dict(_kubeconfig(tokenFile="token"), base_dir=fleet)
    credentials = ClusterCredentials(config, "c")
    assert await credentials.header() == "Bearer a-token-of-its-own"
    (fleet / "token").unlink()
    (fleet / "token").symlink_to(own_token)
    credentials.invalidate()
    with pytest.raises(mcr.Unreachable, match="now leads outside its kubeconfig's directory") as refused:
        await credentials.header()
    assert SECRET not in str(refused.value)


async def test_special_or_huge_files_are_refused_at_load_and_never_block_a_read(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(mcr.KubeconfigError, match=r"tokenFile file .*/fifo is a FIFO, not a regular file"):
        mcr.kubeconfig_from_dict(_kubeconfig(tokenFile="fifo"), base_dir=tmp_path)
    huge = tmp_path / "huge.crt"
    with huge.open("wb") as file:
        file.truncate(5 << 20)  # sparse: 5 MiB that take no disk
    document = _kubeconfig(token="t")
    document["clusters"][0]["cluster"]["certificate-authority"] = "huge.crt"
    with pytest.raises(mcr.KubeconfigError, match="holds 5242880 bytes, more than the 4 MiB"):
        mcr.kubeconfig_from_dict(document, base_dir=tmp_path)
    with pytest.raises(mcr.KubeconfigError, match="is a character device"):
        mcr.kubeconfig_from_dict(_kubeconfig(tokenFile="/dev/zero"), trust=mcr.TrustPolicy.own())
    # A regular token file swapped for a FIFO after loading: the read fails at once, naming it.
    (tmp_path / "token").write_text("t0ken")
    config = mcr.kubeconfig_from_dict(_kubeconfig(tokenFile="token"), base_dir=tmp_path)
    credentials = ClusterCredentials(config, "c")
    (tmp_path / "token").unlink()
    os.mkfifo(tmp_path / "token")
    with pytest.raises(
        mcr.Unreachable, match=r"tokenFile .*/token cannot be read: a FIFO, not a regular file"
    ):
        await asyncio.wait_for(credentials.header(), 30)


def _referencing(field: str, path: str) -> dict[str, Any]:
    """A kubeconfig whose ``field`` (a user's or the cluster's file reference) names ``path``."""
    if field == "certificate-authority":
        document = _kubeconfig(token="t")
        document["clusters"][0]["cluster"][field] = path
        return document
    user: dict[str, Any] = {field: path}
    if field == "client-certificate":
        user["client-key-data"] = "a2V5"
    elif field == "client-key":
        user["client-certificate-data"] = "Y2VydA=="
    return _kubeconfig(**user)


def _refusal(document: dict[str, Any], base_dir: Path | None) -> tuple[type[Exception], str]:
    with pytest.raises(mcr.KubeconfigError) as refused:
        mcr.kubeconfig_from_dict(document, base_dir=base_dir, origin="Secret fleet/x")
    return type(refused.value), str(refused.value)


FILE_FIELDS = ("tokenFile", "certificate-authority", "client-certificate", "client-key")


@pytest.mark.parametrize("field", FILE_FIELDS)
@pytest.mark.parametrize("with_directory", [False, True], ids=["secret", "file"])
def test_a_refused_path_reads_the_same_whether_or_not_the_file_exists(
    field: str, with_directory: bool, tmp_path: Path
) -> None:
    """The policy decides before the file system is asked: no "does not exist" oracle, no "create it" hint.

    "/etc/passwd" was refused by the policy while "/nonexistent/token" was
    "does not exist": whoever writes a kubeconfig Secret and reads its status
    learnt which files the controller's machine has.
    """
    fleet = tmp_path / "fleet"
    fleet.mkdir()
    outside = tmp_path / "controller" / "token"
    outside.parent.mkdir()
    outside.write_text(SECRET)
    (fleet / "link").symlink_to(outside)
    base_dir = fleet if with_directory else None
    references = [str(outside), "~root/.kube/token", "~no-such-user-here/token", "../controller/token"]
    if with_directory:
        references.append("link")  # inside by name, outside once followed
    for reference in references:
        existing = _refusal(_referencing(field, reference), base_dir)
        outside.unlink()
        missing = _refusal(_referencing(field, reference), base_dir)
        outside.write_text(SECRET)
        assert existing == missing, reference
        kind, message = existing
        assert "does not exist" not in message and SECRET not in message
        if not with_directory and not reference.startswith(("/", "~")):
            assert "is a relative path" in message and "pass base_dir" in message, message
            continue  # told from the name alone, as before
        assert kind is mcr.TrustPolicyError, message
        assert f"{field} names a file" in message and "which this trust policy refuses" in message, message


def test_a_file_inside_the_directory_is_still_looked_up_and_named(tmp_path: Path) -> None:
    """Allowed by the policy, a path is checked as before: a missing file inside says so."""
    with pytest.raises(mcr.KubeconfigError) as refused:
        mcr.kubeconfig_from_dict(_kubeconfig(tokenFile="token"), base_dir=tmp_path)
    assert not isinstance(refused.value, mcr.TrustPolicyError)
    assert f"tokenFile file {tmp_path / 'token'} does not exist" in str(refused.value)


async def test_a_token_link_swapped_outside_is_refused_whether_or_not_its_target_exists(
    tmp_path: Path, own_token: Path
) -> None:
    fleet = tmp_path / "fleet"
    fleet.mkdir()
    (fleet / "token").write_text("a-token-of-its-own")
    config = mcr.kubeconfig_from_dict(_kubeconfig(tokenFile="token"), base_dir=fleet)
    credentials = ClusterCredentials(config, "c")
    assert await credentials.header() == "Bearer a-token-of-its-own"
    (fleet / "token").unlink()
    (fleet / "token").symlink_to(tmp_path / "no-such-file")  # a dangling link out: the stat fails
    credentials.invalidate()
    with pytest.raises(mcr.Unreachable, match="now leads outside its kubeconfig's directory"):
        await credentials.header()


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("tokenFile", SECRET),
        ("client-key", "-----BEGIN EC PRIVATE KEY-----\nMHcCAQEEIN0tAk3y\n-----END EC PRIVATE KEY-----\n"),
    ],
)
def test_a_credential_typed_into_a_path_field_is_never_quoted(field: str, value: str, tmp_path: Path) -> None:
    user: dict[str, Any] = {field: value}
    if field == "client-key":
        user["client-certificate-data"] = "Y2VydA=="
    with pytest.raises(mcr.KubeconfigError) as refused:
        mcr.kubeconfig_from_dict(_kubeconfig(**user), base_dir=tmp_path)
    message = str(refused.value)
    assert f"{field} file (a value of" in message and "looks like a credential, not a path" in message
    assert "controllers-own" not in message and "PRIVATE" not in message and "MHcCAQ" not in message


def test_a_proxy_url_that_cannot_work_is_named_at_load_without_its_password() -> None:
    for proxy in ("ftp://proxy.example:21", "http://", "http://user:hunter2@proxy.example:notaport"):
        document = _kubeconfig(token="t")
        document["clusters"][0]["cluster"]["proxy-url"] = proxy
        with pytest.raises(
            mcr.KubeconfigError, match=r"proxy-url must be an http\(s\) URL with a host"
        ) as refused:
            mcr.kubeconfig_from_dict(document)
        assert "hunter2" not in str(refused.value)
    document = _kubeconfig(token="t")
    document["clusters"][0]["cluster"]["proxy-url"] = "http://user:hunter2@proxy.example:3128"
    assert mcr.kubeconfig_from_dict(document).cluster["proxy-url"].endswith("proxy.example:3128")


def test_a_missing_contexts_error_lists_a_few_names_quoted() -> None:
    document = _kubeconfig(token="t")
    document["contexts"] = [
        {"name": f"ctx-{n:03d}\x1b[31m", "context": {"cluster": "c", "user": "u"}} for n in range(40)
    ]
    with pytest.raises(mcr.KubeconfigError) as refused:
        mcr.kubeconfig_from_dict(document, "absent")
    message = str(refused.value)
    assert "'ctx-000\\x1b[31m'" in message and "and 30 more" in message  # escaped, as repr writes it
    assert "\x1b" not in message  # no raw escape: a terminal would repaint the line
