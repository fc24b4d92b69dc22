"""ClusterProfileProvider with upstream's own provider file, and with exec plugins that fail or hang."""

from __future__ import annotations

import dataclasses
import json
import re
import sys
from pathlib import Path
from typing import Any

import pytest
from clusterprofile_hub import PLUGIN, Hub, running, status_of

import mcruntime as mcr
from mcruntime.testing import Fleet, Target, wait_until
from mcruntime.testing.conformance import CLUSTER_OPTIONS
from mcruntime_clusterprofile import EXEC_EXTENSION

# --- upstream's own files, and plugins that fail ------------------------------------------------

# cluster-inventory-api's examples/controller-example/plugins/secretreader/provider-config.json,
# as that repository ships it: a relative command, for the Go tooling run from the repository root.
UPSTREAM_PROVIDER_CONFIG = """{
  "providers": [
    {
      "name": "secretreader",
      "execConfig": {
        "apiVersion": "client.authentication.k8s.io/v1",
        "args": null,
        "command": "./bin/secretreader-plugin",
        "env": null,
        "provideClusterInfo": true
      }
    }
  ]
}
"""


def install_plugin(path: Path, body: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o700)


def shared_plugin_entry(hub: Hub, member: Target, name: str) -> dict[str, Any]:
    """An access entry that tells a shared plugin its credential file through the exec extension."""
    entry = hub.access_entry(member, name=name)
    credential = entry["cluster"]["extensions"][0]["extension"][1]
    entry["cluster"]["extensions"] = [{"name": EXEC_EXTENSION, "extension": {"credentialFile": credential}}]
    return entry


async def test_upstreams_provider_config_verbatim_runs_its_relative_command_from_the_working_directory(
    hub: Hub, fleet: Fleet, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The Go tooling hands ``./bin/secretreader-plugin`` to os/exec: the working directory's, not the file's."""
    repository = tmp_path / "cluster-inventory-api"
    config = repository / "examples/controller-example/plugins/secretreader/provider-config.json"
    config.parent.mkdir(parents=True)
    config.write_text(UPSTREAM_PROVIDER_CONFIG)
    install_plugin(repository / "bin/secretreader-plugin", f'exec "{sys.executable}" "{PLUGIN}" "$@"')
    monkeypatch.chdir(repository)  # as upstream's README and CI run it
    member = Target.of(fleet["cluster-2"])
    provider = hub.provider(config)
    async with running(provider):
        await hub.write("upstream", status_of([shared_plugin_entry(hub, member, "secretreader")]))
        await wait_until(
            lambda: (
                hub.key("upstream") in provider.statuses()
                and provider.statuses()[hub.key("upstream")].phase is mcr.ClusterPhase.READY
            ),
            what="the profile's cluster ready through upstream's own provider file",
        )
        cluster = await provider.clusters.wait_engaged(hub.key("upstream"))
        assert await cluster.transport.authorization() == f"Bearer {member.token}"
        assert provider.sources()[hub.key("upstream")].error is None


@pytest.mark.parametrize(
    ("plugin", "body", "said"),
    [
        ("missing", None, "the program is not found or not executable (tried {path})"),
        ("failing", "echo 'no Secret for this cluster' >&2; exit 1", "exited with status 1: no Secret for"),
    ],
)
async def test_a_plugin_that_cannot_give_a_credential_is_seen_in_sources_and_statuses(
    hub: Hub,
    fleet: Fleet,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    plugin: str,
    body: str | None,
    said: str,
) -> None:
    """Reported by the cluster's first probe, a probe interval after engagement at most."""
    path = tmp_path / "bin" / plugin
    if body is not None:
        install_plugin(path, body)
    install_plugin(tmp_path / "bin" / "working-plugin", f'exec "{sys.executable}" "{PLUGIN}" "$@"')
    document = json.loads(UPSTREAM_PROVIDER_CONFIG.replace("./bin/secretreader-plugin", f"./bin/{plugin}"))
    working = json.loads(UPSTREAM_PROVIDER_CONFIG.replace("secretreader", "working"))["providers"][0]
    document["providers"].append(working)
    config = tmp_path / "provider-config.json"
    config.write_text(json.dumps(document))
    monkeypatch.chdir(tmp_path)
    provider = hub.provider(config)
    async with running(provider):
        await hub.write(
            "broken", status_of([shared_plugin_entry(hub, Target.of(fleet["cluster-2"]), "secretreader")])
        )
        await hub.write(
            "good", status_of([shared_plugin_entry(hub, Target.of(fleet["cluster-3"]), "working")])
        )

        def reported() -> bool:
            source = provider.sources().get(hub.key("broken"))
            status = provider.statuses().get(hub.key("broken"))
            return (
                source is not None
                and source.error is not None
                and status is not None
                and status.error is not None
            )

        await wait_until(reported, what="the plugin's failure reported")
        expected = f"exec plugin {plugin!r}: " + said.format(path=path)
        source, status = provider.sources()[hub.key("broken")], provider.statuses()[hub.key("broken")]
        assert expected in (source.error or ""), source.error
        assert (
            source.engaged and status.phase is mcr.ClusterPhase.UNHEALTHY and expected in (status.error or "")
        )

        def good_ready() -> bool:  # the good profile may not be listed yet when the broken one is
            good = provider.statuses().get(hub.key("good"))
            return good is not None and good.phase is mcr.ClusterPhase.READY

        await wait_until(good_ready, what="the other profile's cluster ready")


async def test_a_hanging_plugin_is_shown_waiting_with_its_time_so_far(
    hub: Hub, fleet: Fleet, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    install_plugin(tmp_path / "bin" / "hanging", "exec sleep 600")
    config = tmp_path / "provider-config.json"
    config.write_text(UPSTREAM_PROVIDER_CONFIG.replace("./bin/secretreader-plugin", "./bin/hanging"))
    monkeypatch.chdir(tmp_path)
    options = dataclasses.replace(CLUSTER_OPTIONS, exec_timeout=120.0)
    provider = hub.provider(config, options=options)
    async with running(provider):
        await hub.write(
            "slow", status_of([shared_plugin_entry(hub, Target.of(fleet["cluster-2"]), "secretreader")])
        )

        def waiting() -> bool:
            status = provider.statuses().get(hub.key("slow"))
            return status is not None and status.error is not None and "waiting" in status.error

        await wait_until(waiting, what="the cluster shown waiting for its plugin")
        status = provider.statuses()[hub.key("slow")]
        shown = r"waiting for exec plugin 'hanging' \(stopped after 120 s\) for \d+ s"
        assert status.phase is mcr.ClusterPhase.ENGAGING and re.fullmatch(shown, status.error or "")
        source = provider.sources()[hub.key("slow")]
        assert source.engaged and source.error is None and re.fullmatch(shown, source.detail["waiting"])


async def test_the_provider_file_is_followed_and_the_last_good_one_kept(
    hub: Hub, fleet: Fleet, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fixed plugin path is picked up without a restart; a broken file is reported, never applied."""
    install_plugin(tmp_path / "bin" / "secretreader-plugin", f'exec "{sys.executable}" "{PLUGIN}" "$@"')
    config = tmp_path / "provider-config.json"
    config.write_text(UPSTREAM_PROVIDER_CONFIG.replace("./bin/secretreader-plugin", "./bin/misspelt"))
    monkeypatch.chdir(tmp_path)
    member = Target.of(fleet["cluster-2"])
    provider = hub.provider(config, access_poll_interval=0.05)
    key = hub.key("followed")

    def phase() -> mcr.ClusterPhase | None:
        status = provider.statuses().get(key)
        return status.phase if status is not None else None

    async with running(provider):
        await hub.write("followed", status_of([shared_plugin_entry(hub, member, "secretreader")]))
        await wait_until(
            lambda: phase() is mcr.ClusterPhase.UNHEALTHY, what="unhealthy: the plugin is misspelt"
        )

        config.write_text(UPSTREAM_PROVIDER_CONFIG)  # fixed in place
        await wait_until(lambda: phase() is mcr.ClusterPhase.READY, what="ready on the fixed provider file")
        assert provider.sources()[key].error is None

        config.write_text('{"providers": [')  # a broken edit: reported, the last good file kept
        await wait_until(lambda: str(config) in provider.sources(), what="the broken provider file reported")
        reported = provider.sources()[str(config)]
        assert reported.kind == "ProviderFile" and reported.stale and reported.cluster is None
        assert reported.error == f"{config}: not valid JSON at line 1"
        assert phase() is mcr.ClusterPhase.READY and provider.access is not None
        assert provider.access.names() == ["secretreader"]

        config.write_text(UPSTREAM_PROVIDER_CONFIG)
        await wait_until(lambda: str(config) not in provider.sources(), what="the provider file reads again")
