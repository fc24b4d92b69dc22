"""Tokens that cannot travel in a header, through kubeconfig files: refused by file and context.

A kubeconfig written with ``echo`` (a trailing newline in ``token``), or with a
control or non-ASCII character in it, is refused where it is read, naming the
file and the context, never quoting the token; the file's other contexts
engage. A ``tokenFile`` that ends in a newline is used stripped, as client-go
uses it; one with a bad character inside makes its cluster unhealthy with an
error naming the token file.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
import yaml
from kube_helpers import CREDENTIAL_SHAPES, quotes_token, spoiled

import mcruntime as mcr
from mcruntime.testing import ControlPlane, Fleet, wait_until
from mcruntime.testing._harness import EngagementRecorder, running
from mcruntime.testing.conformance import CLUSTER_OPTIONS, PROBE_INTERVAL
from mcruntime_file import KubeconfigFileProvider


def two_contexts(plane: ControlPlane, shaped_user: dict[str, Any]) -> dict[str, Any]:
    """Context ``good`` with the plane's token user, context ``shaped`` with ``shaped_user``."""
    single = plane.kubeconfig(plane.token_user)
    return {
        "clusters": [{"name": "plane", "cluster": single["clusters"][0]["cluster"]}],
        "users": [
            {"name": "good-user", "user": single["users"][0]["user"]},
            {"name": "shaped-user", "user": shaped_user},
        ],
        "contexts": [
            {"name": "good", "context": {"cluster": "plane", "user": "good-user"}},
            {"name": "shaped", "context": {"cluster": "plane", "user": "shaped-user"}},
        ],
        "current-context": "good",
    }


def provider_for(path: Path) -> tuple[KubeconfigFileProvider, mcr.Manager, EngagementRecorder]:
    provider = KubeconfigFileProvider(
        path, contexts="all", options=CLUSTER_OPTIONS, probe_interval=PROBE_INTERVAL, debounce=0.05
    )
    manager = mcr.Manager(provider, handle_signals=False)
    recorder = EngagementRecorder()
    manager.add(recorder)
    return provider, manager, recorder


@pytest.mark.parametrize("shape", sorted(CREDENTIAL_SHAPES))
async def test_an_inline_token_that_cannot_be_sent_is_refused_naming_file_and_context(
    tmp_path: Path, fleet: Fleet, shape: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    plane = fleet["cluster-1"]
    token = plane.token_user.token
    path = tmp_path / "fleet.kubeconfig"
    path.write_text(yaml.safe_dump(two_contexts(plane, {"token": spoiled(token, shape)})))
    provider, manager, recorder = provider_for(path)
    async with running(manager, recorder):
        await provider.clusters.wait_engaged(f"{path}/good")

        def reported() -> bool:
            status = provider.statuses().get(f"{path}/shaped")
            return status is not None and status.phase is mcr.ClusterPhase.FAILED

        await wait_until(reported, what="the shaped context reported failed")
        error = provider.statuses()[f"{path}/shaped"].error
        assert error == f"{path}, context 'shaped': user 'shaped-user': {CREDENTIAL_SHAPES[shape][1]}" + (
            " (a trailing newline is what `echo` adds: write it with `printf %s` or `echo -n`)"
            if shape == "trailing-newline"
            else ""
        )
        assert provider.clusters.names() == [f"{path}/good"]
        exposed = caplog.text + repr(provider.sources()) + repr(provider.statuses())
        assert not quotes_token(exposed, token)


async def test_token_files_echoed_are_used_and_spoiled_ones_named(tmp_path: Path, fleet: Fleet) -> None:
    plane = fleet["cluster-1"]
    token = plane.token_user.token
    path = tmp_path / "files" / "fleet.kubeconfig"
    path.parent.mkdir()
    # Beside the kubeconfig: an untrusted one may name no file outside its own directory.
    echoed, broken = path.parent / "echoed-token", path.parent / "broken-token"
    echoed.write_text(f"{token}\n")
    broken.write_text(spoiled(token, "non-ascii"))
    document = two_contexts(plane, {"tokenFile": str(broken)})
    document["users"][0]["user"] = {"tokenFile": str(echoed)}
    path.write_text(yaml.safe_dump(document))
    provider, manager, recorder = provider_for(path)
    async with running(manager, recorder):
        await wait_until(
            lambda: (
                provider.statuses().get(f"{path}/good", None) is not None
                and provider.statuses()[f"{path}/good"].phase is mcr.ClusterPhase.READY
            ),
            what="the echoed token file's cluster ready",
        )

        def unhealthy() -> bool:
            status = provider.statuses().get(f"{path}/shaped")
            return status is not None and status.phase is mcr.ClusterPhase.UNHEALTHY

        await wait_until(unhealthy, what="the spoiled token file's cluster unhealthy")
        error = provider.statuses()[f"{path}/shaped"].error or ""
        assert f"tokenFile {broken}: the token has a non-ASCII character at character 9" in error, error
        assert not quotes_token(error + repr(provider.sources()), token)
