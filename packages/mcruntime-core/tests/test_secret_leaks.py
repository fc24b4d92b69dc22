"""No secret reaches a log line, a metric, a probe, a status, a repr or an error.

One manager on the testbed with every kind of credential (tokens, inline
client keys, basic auth, an exec plugin's token), a URL with userinfo (refused
at load), a token revoked while running and a cluster whose server is down;
everything an operator or an attacker could read is collected and searched
for every secret, in plain and base64 form.
"""

from __future__ import annotations

import base64
import io
import json
import logging
import ssl
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest
from kube_helpers import CONFIGMAP, unique
from test_exec_plugin import API, write_plugin

import mcruntime as mcr
from mcruntime._client.wording import describe_connection_error
from mcruntime.log import JSONFormatter
from mcruntime.testing import ControlPlane, Fleet, running, wait_until

PASSWORD = "made-up-basic-password-4c1f9e"
URL_PASSWORD = "made-up-url-password-90ab3d"


async def _get(url: str) -> str:
    async with aiohttp.ClientSession() as session, session.get(url) as response:
        return f"{response.status}\n{await response.text()}"


@pytest.fixture
def captured_logs() -> Iterator[tuple[io.StringIO, io.StringIO]]:
    """Every DEBUG record, as text (with tracebacks) and as JSON."""
    text, structured = io.StringIO(), io.StringIO()
    handlers = [logging.StreamHandler(text), logging.StreamHandler(structured)]
    handlers[0].setFormatter(logging.Formatter("%(levelname)s %(name)s %(message)s"))
    handlers[1].setFormatter(JSONFormatter())
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.DEBUG)
    for handler in handlers:
        root.addHandler(handler)
    yield text, structured
    for handler in handlers:
        root.removeHandler(handler)
    root.setLevel(level)


def forms(secret: str) -> set[str]:
    """The secret and the ways it could be encoded on its way out."""
    encoded = base64.b64encode(secret.encode()).decode()
    return {secret, encoded, json.dumps(secret)[1:-1]}


def key_fragments(pem: bytes) -> set[str]:
    """Distinctive pieces of a PEM private key: body lines and a slice of its base64 form."""
    body = [line for line in pem.decode().splitlines() if line and not line.startswith("-----")]
    encoded = base64.b64encode(pem).decode()
    return {line for line in body if len(line) >= 40} | {encoded[64:128], encoded[-120:-60]}


async def test_no_secret_appears_anywhere_an_operator_can_look(
    fleet: Fleet, fresh_cluster: ControlPlane, tmp_path: Path, captured_logs: tuple[io.StringIO, io.StringIO]
) -> None:
    plane = fleet["cluster-1"]
    token_user = plane.add_token_user(unique("leak-token"))
    revoked_name = unique("leak-revoked")
    revoked_user = plane.add_token_user(revoked_name)
    cert_user = plane.add_cert_user(unique("leak-cert"), groups=("system:masters",))
    exec_user = plane.add_token_user(unique("leak-exec"))
    down_user = fresh_cluster.add_token_user(unique("leak-down"))
    assert token_user.token and revoked_user.token and exec_user.token and down_user.token
    assert cert_user.client_cert is not None
    key_pem = cert_user.client_cert.key_pem

    secrets = set()
    for token in (token_user.token, revoked_user.token, exec_user.token, down_user.token):
        secrets |= forms(token)
    secrets |= forms(PASSWORD) | forms(URL_PASSWORD) | forms(f"admin:{PASSWORD}")
    secrets |= key_fragments(key_pem)

    basic = plane.kubeconfig()
    basic["users"][0]["user"] = {"username": "admin", "password": PASSWORD}
    with_exec = plane.kubeconfig()
    script = write_plugin(tmp_path, exec_user.token)
    with_exec["users"][0]["user"] = {"exec": {"apiVersion": API, "command": str(script)}}
    with_userinfo = plane.kubeconfig(token_user)
    with_userinfo["clusters"][0]["cluster"]["server"] = plane.server.replace(
        "://", f"://admin:{URL_PASSWORD}@"
    )

    texts: list[str] = []
    with pytest.raises(mcr.KubeconfigError) as refused:
        mcr.kubeconfig_from_dict(with_userinfo, origin="userinfo")
    texts += [str(refused.value), repr(refused.value)]

    configs = {
        "token": mcr.kubeconfig_from_dict(plane.kubeconfig(token_user)),
        "revoked": mcr.kubeconfig_from_dict(plane.kubeconfig(revoked_user)),
        "cert": mcr.kubeconfig_from_dict(plane.kubeconfig(cert_user)),
        "basic": mcr.kubeconfig_from_dict(basic),
        "exec": mcr.kubeconfig_from_dict(with_exec, trust=mcr.TrustPolicy(allow_exec=True)),
        "down": mcr.kubeconfig_from_dict(fresh_cluster.kubeconfig(down_user)),
    }
    await fresh_cluster.stop_async()
    options = mcr.ClusterOptions(retry=mcr.RetryPolicy(attempts=2, base_delay=0.01), cache_sync_timeout=5)
    provider = mcr.StaticProvider(configs, options=options, probe_interval=0.2)
    manager = mcr.Manager(
        provider, health_probe_address="127.0.0.1:0", metrics_address="127.0.0.1:0", handle_signals=False
    )
    mcr.controller_managed_by(manager).named("leaks").for_(CONFIGMAP).complete(_nothing)
    async with running(manager):
        clusters = {name: await provider.clusters.wait_engaged(name) for name in ("token", "cert", "exec")}
        for cluster in clusters.values():
            await cluster.client.list(CONFIGMAP, namespace="default")
        await wait_until(
            lambda: {"basic", "down", "revoked"} <= set(provider.statuses()), timeout=20, what="all engaged"
        )

        errors: list[BaseException] = []
        basic_cluster = await manager.get_cluster("basic")
        try:
            await basic_cluster.client.list(CONFIGMAP, namespace="default")
        except mcr.MCRuntimeError as error:
            errors.append(error)
        down_cluster = await manager.get_cluster("down")
        with pytest.raises(mcr.Unreachable) as unreachable:
            await down_cluster.client.list(CONFIGMAP, namespace="default")
        errors.append(unreachable.value)

        revoked_cluster = await manager.get_cluster("revoked")
        plane.revoke_token_user(revoked_name)

        async def rejected() -> bool:
            try:
                await revoked_cluster.client.list(CONFIGMAP, namespace="default")
            except mcr.APIError as error:
                errors.append(error)
                return error.status == 401
            return False

        await wait_until(rejected, timeout=40, interval=0.5, what="the revoked token is refused")

        texts += [await _get(manager.endpoints.url("/metrics"))]
        texts += [await _get(manager.endpoints.url(path) + "?verbose") for path in ("/readyz", "/healthz")]
        texts += [repr(provider.statuses()), str(provider.statuses())]
        for name in configs:
            cluster = await manager.get_cluster(name)
            texts += [
                repr(cluster),
                str(cluster),
                repr(cluster.transport),
                repr(cluster.config),
                str(cluster.health),
            ]
            texts += [repr(cluster.transport._credentials), repr(cluster.transport._material)]
        texts += [f"{error!s} {error!r} {error.args!r}" for error in errors]
    texts += [captured_logs[0].getvalue(), captured_logs[1].getvalue()]
    everything = "\n".join(texts)

    # We looked at the right things: probes, metrics, DEBUG records in both formats.
    assert "cluster:down" in everything and "mcruntime_" in everything
    assert " mcruntime." in captured_logs[0].getvalue() and '"level"' in captured_logs[1].getvalue()
    assert any(isinstance(error, mcr.APIError) and error.status == 401 for error in errors)
    leaked = sorted(secret for secret in secrets if secret in everything)
    assert not leaked, f"{len(leaked)} secret forms leaked"


async def _nothing(_request: mcr.Request) -> None:
    return None


def test_connection_errors_are_described_without_urls_or_headers() -> None:
    url = f"https://admin:{URL_PASSWORD}@example.invalid:6443/api"
    errors: list[BaseException] = [
        aiohttp.InvalidURL(url),
        aiohttp.ClientPayloadError(f"while reading {url}"),
        aiohttp.ServerDisconnectedError(url),
        aiohttp.ClientOSError(104, f"Connection reset by peer at {url}"),
        ssl.SSLError(1, f"[SSL] something about {url}"),
        RuntimeError(f"Authorization: Bearer {URL_PASSWORD}"),
        TimeoutError(),
    ]

    for error in errors:
        description = describe_connection_error(error)
        assert URL_PASSWORD not in description
        assert "example.invalid" not in description
        assert description


def test_reprs_redact_userinfo_even_in_a_config_built_by_hand() -> None:
    # The loaders refuse such a URL; a ClusterConfig constructed directly still must not show it.
    config = mcr.ClusterConfig(
        origin="by hand",
        context=None,
        cluster_name="c",
        user_name=None,
        cluster={"server": f"https://admin:{URL_PASSWORD}@example.invalid:6443"},
        user={},
    )
    cluster = mcr.Cluster("by-hand", config)

    for text in (repr(config), repr(cluster), repr(cluster.transport)):
        assert URL_PASSWORD not in text
        assert "example.invalid:6443" in text
