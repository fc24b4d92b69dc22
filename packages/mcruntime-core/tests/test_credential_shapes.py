"""Tokens that cannot travel in a header: refused where they come in, and never a silent stall.

A token ending in a newline (what ``echo`` into a file or Secret gives), with a
control character or with a non-ASCII character used to pass loading and then
make the HTTP client raise a ``ValueError`` on every request: the probe loop
crashed and restarted, and the cluster sat in ``ENGAGING`` with no error. Now
a kubeconfig's inline token is refused when it is loaded, naming the file and
the context; a ``tokenFile`` is stripped of surrounding whitespace (as client-go
strips it) and refused by name when its middle is bad; and whatever still goes
wrong while a request is built or sent becomes the cluster's reported error.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from pathlib import Path
from types import MappingProxyType

import aiohttp
import pytest
from kube_helpers import CONFIGMAP, CREDENTIAL_SHAPES, quotes_token, spoiled

import mcruntime as mcr
from mcruntime._client.health import HealthRecord
from mcruntime._config.exec import ExecPlugin, ExecPluginError
from mcruntime.client import HealthState
from mcruntime.testing import Fleet, wait_until
from mcruntime.testing._harness import EngagementRecorder, running

TOKEN = "made-up-token-5a1e7c0ffee"
OPTIONS = mcr.ClusterOptions(health_probe_interval=0.5, retry=mcr.RetryPolicy(attempts=1))


def token_kubeconfig(token: str) -> dict[str, object]:
    return {
        "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}],
        "users": [{"name": "u", "user": {"token": token}}],
        "contexts": [{"name": "ctx", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "ctx",
    }


@pytest.mark.parametrize("shape", sorted(CREDENTIAL_SHAPES))
def test_an_inline_token_that_cannot_be_sent_is_refused_at_load_naming_file_and_context(shape: str) -> None:
    with pytest.raises(mcr.KubeconfigError) as caught:
        mcr.kubeconfig_from_dict(token_kubeconfig(spoiled(TOKEN, shape)), origin="/etc/fleet/a.kubeconfig")

    message = str(caught.value)
    assert message.startswith("/etc/fleet/a.kubeconfig, context 'ctx': user 'u': ")
    assert CREDENTIAL_SHAPES[shape][1] in message
    assert not quotes_token(message, TOKEN)
    if shape == "trailing-newline":
        assert "`echo`" in message  # the likely cause, and the fix


def test_a_plugin_token_that_cannot_be_sent_fails_the_run_by_name() -> None:
    plugin = ExecPlugin(
        {"apiVersion": "client.authentication.k8s.io/v1", "command": "p"}, cluster="c1", server="s"
    )
    printed = {"apiVersion": "client.authentication.k8s.io/v1", "kind": "ExecCredential"}
    printed["status"] = {"token": TOKEN + "\n"}  # type: ignore[assignment]

    with pytest.raises(ExecPluginError) as caught:
        plugin._credential(json.dumps(printed).encode())

    assert "status.token ends with a line break" in str(caught.value) and "c1" in str(caught.value)
    assert not quotes_token(str(caught.value), TOKEN)


async def test_a_token_file_ending_in_a_newline_is_used_stripped(fleet: Fleet, tmp_path: Path) -> None:
    plane = fleet["cluster-2"]
    token_file = tmp_path / "token"
    token_file.write_text(f"{plane.token_user.token}\n")  # what `echo $TOKEN > token` writes
    data = plane.kubeconfig(plane.token_user)
    data["users"][0]["user"] = {"tokenFile": str(token_file)}

    config = mcr.kubeconfig_from_dict(data, base_dir=tmp_path)  # the token file beside it, as a provider's
    async with mcr.Cluster("echoed", config, OPTIONS) as cluster:
        await cluster.client.list(CONFIGMAP, namespace="default")

        assert await cluster.transport.authorization() == f"Bearer {plane.token_user.token}"


async def test_a_token_file_with_a_control_character_is_the_clusters_error_naming_the_file(
    fleet: Fleet, tmp_path: Path
) -> None:
    plane = fleet["cluster-2"]
    token = plane.token_user.token
    token_file = tmp_path / "token"
    token_file.write_text(spoiled(token, "control-character"))
    data = plane.kubeconfig(plane.token_user)
    data["users"][0]["user"] = {"tokenFile": str(token_file)}

    config = mcr.kubeconfig_from_dict(data, base_dir=tmp_path)
    async with mcr.Cluster("spoiled", config, OPTIONS) as cluster:
        await wait_until(lambda: cluster.health.state is HealthState.UNHEALTHY, what="the cluster unhealthy")
        reason = cluster.health.reason or ""
        assert f"tokenFile {token_file}: the token has a control character at character 9" in reason
        assert not quotes_token(reason, token)
        with pytest.raises(mcr.Unreachable, match="tokenFile"):
            await cluster.client.list(CONFIGMAP, namespace="default")

        token_file.write_text(f"{token}\n")  # fixed in place: the probe sees it, no restart
        await wait_until(lambda: cluster.health.healthy, what="the cluster healthy again")
        assert cluster.failing_loops() == []


async def test_any_error_while_sending_becomes_the_clusters_reported_error(fleet: Fleet) -> None:
    """A token the load check never saw (built in code) still stalls nothing and says why.

    aiohttp refuses a header with a line break with a ``ValueError``; before,
    that escaped the transport, the probe loop crashed over and over, and the
    cluster stayed ``ENGAGING`` with no error, in ``statuses()`` and ``/readyz``.
    """
    plane = fleet["cluster-3"]
    token = plane.token_user.token
    assert token is not None
    good = mcr.kubeconfig_from_dict(plane.kubeconfig(plane.token_user))
    bad = dataclasses.replace(good, user=MappingProxyType({"token": token + "\n"}))
    provider = mcr.StaticProvider({"bad": bad, "good": good}, options=OPTIONS, probe_interval=0.5)
    manager = mcr.Manager(provider, handle_signals=False, health_probe_address="127.0.0.1:0")
    recorder = EngagementRecorder()
    manager.add(recorder)
    async with running(manager, recorder):

        def reported() -> bool:
            status = provider.statuses().get("bad")
            return status is not None and status.phase is mcr.ClusterPhase.UNHEALTHY

        await wait_until(reported, what="the cluster with the unsendable token reported unhealthy")
        status = provider.statuses()["bad"]
        assert status.error is not None
        assert "GET /version failed on our side (ValueError: " in status.error, status.error
        assert "the server was not asked" in status.error
        cluster = await provider.get("bad")
        assert cluster.failing_loops() == []  # the probe loop itself never crashed
        with pytest.raises(mcr.Unreachable, match="failed on our side"):
            await cluster.client.list(CONFIGMAP, namespace="default")
        await wait_until(
            lambda: provider.statuses()["good"].phase is mcr.ClusterPhase.READY, what="good ready"
        )
        url = manager.endpoints.url("/readyz") + "?verbose"
        async with aiohttp.ClientSession() as session, session.get(url) as response:
            readyz = await response.text()
        assert (
            "cluster:bad failed: unhealthy: sending GET /version failed on our side (ValueError" in readyz
        ), readyz
        exposed = readyz + repr(provider.statuses()) + (cluster.health.last_error or "")
        assert not quotes_token(exposed, token)


async def test_a_probe_that_raises_is_recorded_and_the_loop_goes_on() -> None:
    """Whatever a probe raises becomes the cluster's reason; the loop is never what crashes."""
    record = HealthRecord("raising")
    calls = 0

    async def raising_probe(_timeout: float) -> tuple[str, bool] | None:
        nonlocal calls
        calls += 1
        raise ValueError(f"{TOKEN} was in the message")  # its text is never shown

    task = asyncio.create_task(
        record.probe_forever(raising_probe, interval=5.0, timeout=5.0, backoff=mcr.Backoff(base=0.0, cap=0.0))
    )
    try:
        await wait_until(lambda: calls >= 3, what="three probes, each raising")
        assert not task.done(), "the probe loop died"
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    health = record.snapshot()
    assert health.state is HealthState.UNHEALTHY
    assert health.reason == "the health probe failed on our side (ValueError)"
    assert not quotes_token(str(health), TOKEN)
