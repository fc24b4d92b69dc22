"""ClusterProfileProvider against real control planes: a hub with our ClusterProfile CRD, members from the fleet.

Credentials come from ``token_plugin.py``, a real exec plugin run by the core,
which prints the credential kept in a file the profile names (KEP-5339
additional-args, allowed by the consumer's provider file).
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import hashlib
import json
import logging
import re
import sys
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, ClassVar

import pytest
import pytest_asyncio
import yaml

import mcruntime as mcr
from mcruntime.testing import ControlPlane, Fleet, Target, admin_config, wait_until
from mcruntime.testing import running as run_manager
from mcruntime.testing.conformance import (
    CLUSTER_OPTIONS,
    PROBE_INTERVAL,
    Capability,
    ProviderConformance,
    ProviderDriver,
)
from mcruntime_clusterprofile import (
    ADDITIONAL_ARGS_EXTENSION,
    ADDITIONAL_ENVS_EXTENSION,
    CLUSTER_MANAGER_LABEL,
    CLUSTER_PROFILE,
    EXEC_EXTENSION,
    AccessConfig,
    ClusterProfileNotInstalled,
    ClusterProfileProvider,
)

HERE = Path(__file__).parent
PLUGIN = HERE / "token_plugin.py"
CRD = mcr.Kind("apiextensions.k8s.io/v1", "CustomResourceDefinition")
CONFIGMAP = mcr.Kind("v1", "ConfigMap")
ACCESS_NAME = "testbed"


def access_config(*names: str, args: str = "Append", env: str = "Ignore") -> AccessConfig:
    """The consumer's provider file: the test plugin under each name, profile args appended."""
    return AccessConfig.from_dict(
        {
            "providers": [
                {
                    "name": name,
                    "execConfig": {
                        "apiVersion": "client.authentication.k8s.io/v1",
                        "command": sys.executable,
                        "args": [str(PLUGIN)],
                        "env": [{"name": "PLUGIN_TENANT", "value": "from-file"}],
                        "provideClusterInfo": True,
                    },
                    "profileSourcedCLIArgsPolicy": args,
                    "profileSourcedEnvVarsPolicy": env,
                }
                for name in (names or (ACCESS_NAME,))
            ]
        },
        origin="test provider file",
    )


async def install_crd(cluster: mcr.Cluster) -> None:
    manifest = yaml.safe_load((HERE / "clusterprofile-crd.yaml").read_text())
    with contextlib.suppress(mcr.AlreadyExists):
        await cluster.client.create(manifest)

    async def established() -> bool:
        crd = await cluster.client.get(CRD, manifest["metadata"]["name"])
        conditions = (crd.get("status") or {}).get("conditions") or []
        return any(c.get("type") == "Established" and c.get("status") == "True" for c in conditions)

    await wait_until(established, what="the ClusterProfile CRD is established")
    await wait_until(lambda: _served(cluster), what="the ClusterProfile kind is served")


async def _served(cluster: mcr.Cluster) -> bool:
    await cluster.client.discovery.refresh()
    try:
        await cluster.client.resource(CLUSTER_PROFILE)
    except mcr.KindNotFound:
        return False
    return True


class Hub:
    """A namespace of the hub, and the writes a cluster manager would make there."""

    def __init__(self, plane: ControlPlane, writer: mcr.Cluster, namespace: str, files: Path) -> None:
        self.plane, self.writer, self.namespace, self.files = plane, writer, namespace, files
        self.written: dict[str, str | None] = {}  # name -> last resourceVersion (None: deleted)

    def key(self, name: str) -> str:
        return f"{self.namespace}/{name}"

    def credential_file(self, target: Target) -> str:
        """A file holding the target's credential, named by its content (same credential, same path)."""
        if target.token is not None:
            status: dict[str, str] = {"token": target.token}
        else:
            entry = target.user_entry()
            status = {
                "clientCertificateData": base64.b64decode(entry["client-certificate-data"]).decode(),
                "clientKeyData": base64.b64decode(entry["client-key-data"]).decode(),
            }
        text = json.dumps(status)
        path = self.files / f"credential-{hashlib.sha256(text.encode()).hexdigest()[:16]}.json"
        path.write_text(text)
        path.chmod(0o600)
        return str(path)

    def access_entry(self, target: Target, name: str = ACCESS_NAME, **extra: Any) -> dict[str, Any]:
        cluster: dict[str, Any] = {
            "server": target.server,
            "certificate-authority-data": base64.b64encode(target.ca_pem).decode(),
            "extensions": [
                {
                    "name": ADDITIONAL_ARGS_EXTENSION,
                    "extension": ["--credential-file", self.credential_file(target)],
                }
            ],
        }
        cluster.update(extra)
        return {"name": name, "cluster": cluster}

    async def write(
        self,
        name: str,
        status: dict[str, Any] | None,
        *,
        labels: dict[str, str] | None = None,
        annotations: dict[str, str] | None = None,
    ) -> None:
        manifest = {
            "apiVersion": CLUSTER_PROFILE.api_version,
            "kind": "ClusterProfile",
            "metadata": {
                "name": name,
                "namespace": self.namespace,
                "labels": {CLUSTER_MANAGER_LABEL: "test-manager", **(labels or {})},
                "annotations": annotations or {},
            },
            "spec": {"displayName": name, "clusterManager": {"name": "test-manager"}},
        }
        applied = await self.writer.client.apply(manifest, field_manager="manager", force=True)
        if status is not None:
            applied = await self.writer.client.apply(
                {
                    "apiVersion": CLUSTER_PROFILE.api_version,
                    "kind": "ClusterProfile",
                    "metadata": {"name": name, "namespace": self.namespace},
                    "status": status,
                },
                field_manager="manager",
                force=True,
                subresource="status",
            )
        self.written[name] = applied["metadata"]["resourceVersion"]

    async def profile(self, name: str, target: Target, *, healthy: bool = True, **options: Any) -> None:
        await self.write(name, status_of([self.access_entry(target)], healthy=healthy), **options)

    async def delete(self, name: str) -> None:
        await self.writer.client.delete(CLUSTER_PROFILE, name, namespace=self.namespace)
        self.written[name] = None

    def provider(self, access: AccessConfig | Path | None = None, **options: Any) -> ClusterProfileProvider:
        options.setdefault("options", CLUSTER_OPTIONS)
        options.setdefault("probe_interval", PROBE_INTERVAL)
        options.setdefault("namespace", self.namespace)
        return ClusterProfileProvider(admin_config(self.plane), access or access_config(), **options)

    async def settled(self, provider: ClusterProfileProvider) -> None:
        def caught_up() -> bool:
            seen = provider.sources()
            for name, version in self.written.items():
                status = seen.get(self.key(name))
                if (version is None) != (status is None) or (status and status.version != version):
                    return False
            return True

        await wait_until(caught_up, what="the provider processed every write")


def status_of(
    access: list[dict[str, Any]], *, healthy: bool = True, field: str = "accessProviders"
) -> dict[str, Any]:
    return {
        "conditions": [
            {
                "type": "ControlPlaneHealthy",
                "status": "True" if healthy else "False",
                "reason": "Probed",
                "message": "",
                "lastTransitionTime": "2026-01-01T00:00:00Z",
            }
        ],
        field: access,
    }


@pytest_asyncio.fixture
async def hub(fleet: Fleet, tmp_path: Path) -> AsyncIterator[Hub]:
    plane = fleet["cluster-1"]
    async with mcr.Cluster("hub", admin_config(plane)) as writer:
        await install_crd(writer)
        namespace = f"cp-{uuid.uuid4().hex[:8]}"
        await writer.client.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
        yield Hub(plane, writer, namespace, tmp_path)


# --- the conformance suite -------------------------------------------------------------------


class ClusterProfileDriver(ProviderDriver):
    """The source is a namespace of the hub: a healthy ClusterProfile per cluster."""

    unsupported: ClassVar[dict[Capability, str]] = {
        Capability.DUPLICATE_NAMES: "names are <namespace>/<name> of ClusterProfiles, unique by construction",
    }

    def __init__(self, hub: Hub) -> None:
        self.hub = hub
        self.provider: ClusterProfileProvider | None = None
        self.touches = 0
        self.targets: dict[str, Target] = {}

    def build(self) -> mcr.Provider:
        self.provider = self.hub.provider()
        return self.provider

    def engaged_name(self, name: str) -> str:
        return self.hub.key(name)

    def status(self, name: str) -> mcr.ClusterStatus | None:
        return self.provider.statuses().get(self.hub.key(name)) if self.provider is not None else None

    async def add(self, name: str, target: Target) -> None:
        self.targets[name] = target
        await self.hub.profile(name, target)

    async def corrupt(self, name: str) -> None:
        entry = self.hub.access_entry(self.targets[name])
        entry["cluster"]["server"] = "https://[::1"  # a bad edit: no URL
        await self.hub.write(name, status_of([entry]))

    async def touch(self, name: str, target: Target) -> None:
        self.touches += 1
        await self.hub.profile(name, target, annotations={"touched": str(self.touches)})

    async def remove(self, name: str) -> None:
        await self.hub.delete(name)

    async def settle(self) -> None:
        assert self.provider is not None
        await self.hub.settled(self.provider)


class TestClusterProfileProviderConformance(ProviderConformance):
    @pytest.fixture
    def driver(self, hub: Hub) -> ProviderDriver:
        return ClusterProfileDriver(hub)


# --- the ClusterProfile API's own edges ----------------------------------------------------------


async def _nothing(_request: mcr.Request) -> None:
    return None


@asynccontextmanager
async def running(provider: ClusterProfileProvider) -> AsyncIterator[mcr.Manager]:
    manager = mcr.Manager(provider, handle_signals=False)
    mcr.controller_managed_by(manager).named("noop").for_(CONFIGMAP, namespace="kube-system").complete(
        _nothing
    )
    async with run_manager(manager, tasks_must_end=False):
        yield manager


async def test_engaged_once_healthy_and_not_ready_is_not_gone(hub: Hub, fleet: Fleet) -> None:
    member = Target.of(fleet["cluster-2"])
    provider = hub.provider()
    async with running(provider) as manager:
        await hub.write("m", None)  # just created, no status yet: waiting, not failed
        await hub.settled(provider)
        assert provider.sources()[hub.key("m")].error is None
        assert hub.key("m") not in provider.statuses()
        await hub.profile("m", member, healthy=False)
        await hub.settled(provider)
        assert provider.clusters.names() == []
        source = provider.sources()[hub.key("m")]
        assert source.detail["ready"] == "false" and source.error is None and not source.engaged
        assert hub.key("m") not in provider.statuses()  # waiting is no failure
        await hub.profile("m", member, healthy=True)
        cluster = await provider.clusters.wait_engaged(hub.key("m"))
        await cluster.client.list(CONFIGMAP, namespace="default")
        assert await cluster.transport.authorization() == f"Bearer {member.token}"
        await hub.profile("m", member, healthy=False)  # unhealthy again: stays engaged
        await hub.settled(provider)
        assert await manager.get_cluster(hub.key("m")) is cluster
        status = provider.statuses()[hub.key("m")]
        assert status.source is not None and status.source.detail == {
            "ready": "false",
            "access_provider": "testbed",
        }


async def test_deletion_and_a_held_deletion_both_disengage(hub: Hub, fleet: Fleet) -> None:
    provider = hub.provider()
    async with running(provider) as manager:
        for name in ("plain", "held"):
            await hub.profile(name, Target.of(fleet["cluster-2"]))
            await provider.clusters.wait_engaged(hub.key(name))
        await hub.writer.client.patch(
            CLUSTER_PROFILE, "held", {"metadata": {"finalizers": ["test/hold"]}}, namespace=hub.namespace
        )
        await hub.writer.client.delete(CLUSTER_PROFILE, "held", namespace=hub.namespace)  # stays, deleting
        await hub.delete("plain")
        await wait_until(
            lambda: not ({hub.key("plain"), hub.key("held")} & set(manager.clusters())), what="both let go"
        )
        await hub.writer.client.patch(
            CLUSTER_PROFILE, "held", {"metadata": {"finalizers": None}}, namespace=hub.namespace
        )


async def test_access_providers_win_over_deprecated_credential_providers(hub: Hub, fleet: Fleet) -> None:
    two, three = Target.of(fleet["cluster-2"]), Target.of(fleet["cluster-3"])
    provider = hub.provider(access_config("preferred", ACCESS_NAME))
    async with running(provider):
        # The deprecated list alone is honoured.
        await hub.write("old", status_of([hub.access_entry(two)], field="credentialProviders"))
        # Both lists name the provider: accessProviders wins.
        both = status_of([hub.access_entry(three)])
        both["credentialProviders"] = [hub.access_entry(two)]
        await hub.write("both", both)
        # Two names offered: the consumer's file order decides, not the profile's.
        await hub.write(
            "order", status_of([hub.access_entry(two), hub.access_entry(three, name="preferred")])
        )
        old = await provider.clusters.wait_engaged(hub.key("old"))
        both_cluster = await provider.clusters.wait_engaged(hub.key("both"))
        order = await provider.clusters.wait_engaged(hub.key("order"))
        assert old.config.server == two.server
        assert both_cluster.config.server == three.server
        assert order.config.server == three.server
        # Sources are published once the pass that engaged them is applied, a moment after.
        await wait_until(
            lambda: (s := provider.sources().get(hub.key("order"))) is not None and s.engaged,
            what="the profile's source published",
        )
        assert provider.sources()[hub.key("order")].detail["access_provider"] == "preferred"


async def test_a_profile_without_a_supported_access_provider_is_reported(hub: Hub, fleet: Fleet) -> None:
    provider = hub.provider()
    async with running(provider):
        await hub.write("foreign", status_of([hub.access_entry(Target.of(fleet["cluster-2"]), name="other")]))
        await hub.profile("good", Target.of(fleet["cluster-3"]))
        await provider.clusters.wait_engaged(hub.key("good"))
        await hub.settled(provider)
        error = provider.statuses()[hub.key("foreign")].error or ""
        assert f"ClusterProfile {hub.key('foreign')}" in error
        assert "offers no access provider this consumer supports" in error and "'other'" in error
        assert provider.statuses()[hub.key("foreign")].phase is mcr.ClusterPhase.FAILED


async def test_profile_sourced_env_and_args_follow_the_file_policies(
    hub: Hub, fleet: Fleet, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runs = tmp_path / "runs.log"
    monkeypatch.setenv("PLUGIN_LOG", str(runs))
    member = Target.of(fleet["cluster-2"])
    envs = {"name": ADDITIONAL_ENVS_EXTENSION, "extension": {"PLUGIN_TENANT": "from-profile"}}
    provider = hub.provider(access_config(env="Replace"))
    async with running(provider):
        entry = hub.access_entry(member)
        entry["cluster"]["extensions"].append(envs)
        await hub.write("replace", status_of([entry]))
        cluster = await provider.clusters.wait_engaged(hub.key("replace"))
        await cluster.client.list(CONFIGMAP, namespace="default")
    first = json.loads(runs.read_text().splitlines()[0])
    assert first["env"] == "from-profile" and first["args"][0] == "--credential-file"
    runs.unlink()
    kept = hub.provider(access_config(env="AppendIfNotExists"))
    async with running(kept):
        cluster = await kept.clusters.wait_engaged(hub.key("replace"))
        await cluster.client.list(CONFIGMAP, namespace="default")
    assert json.loads(runs.read_text().splitlines()[0])["env"] == "from-file"


async def test_a_changed_server_re_engages_and_a_rotated_credential_is_swapped(
    hub: Hub, fleet: Fleet
) -> None:
    plane = fleet["cluster-2"]
    before = plane.add_token_user(f"cp-{uuid.uuid4().hex[:6]}")
    after = plane.add_token_user(f"cp-{uuid.uuid4().hex[:6]}")
    provider = hub.provider()
    async with running(provider) as manager:
        await hub.profile("m", Target.of(plane, before))
        cluster = await provider.clusters.wait_engaged(hub.key("m"))
        await hub.profile("m", Target.of(plane, after))
        await hub.settled(provider)
        assert await manager.get_cluster(hub.key("m")) is cluster  # swapped in place
        assert await cluster.transport.authorization() == f"Bearer {after.token}"
        await hub.profile("m", Target.of(fleet["cluster-3"]))

        def moved() -> bool:
            engaged = manager.clusters().get(hub.key("m"))
            return (
                engaged is not None
                and engaged is not cluster
                and engaged.config.server == fleet["cluster-3"].server
            )

        await wait_until(moved, what="the cluster re-engaged at the new server")


async def test_the_label_selector_scopes_the_profiles(hub: Hub, fleet: Fleet) -> None:
    provider = hub.provider(label_selector={CLUSTER_MANAGER_LABEL: "test-manager", "fleet": "blue"})
    async with running(provider):
        await hub.profile("blue", Target.of(fleet["cluster-2"]), labels={"fleet": "blue"})
        await hub.profile("green", Target.of(fleet["cluster-3"]), labels={"fleet": "green"})
        await provider.clusters.wait_engaged(hub.key("blue"))
        await wait_until(lambda: hub.key("blue") in provider.sources(), what="blue read")
        assert set(provider.sources()) == {hub.key("blue")}


async def test_untrusted_input_is_bounded_and_named(hub: Hub, fleet: Fleet) -> None:
    member = Target.of(fleet["cluster-2"])
    provider = hub.provider(max_access_providers=3, max_profile_bytes=16 * 1024, max_string_chars=256)
    async with running(provider):
        await hub.profile("good", member)
        await hub.write("many", status_of([hub.access_entry(member, name=f"p{i}") for i in range(4)]))
        long_args = {"name": ADDITIONAL_ARGS_EXTENSION, "extension": ["x" * 300]}
        await hub.write("long", status_of([hub.access_entry(member, extensions=[long_args])]))
        await hub.write(
            "path", status_of([hub.access_entry(member, **{"certificate-authority": "/etc/passwd"})])
        )
        huge = status_of([hub.access_entry(member)])
        huge["properties"] = [{"name": f"vendor.example/p{i}", "value": "v" * 1000} for i in range(20)]
        await hub.write("huge", huge, annotations={"unread": "z" * 20_000})
        await hub.settled(provider)
        await provider.clusters.wait_engaged(hub.key("good"))
        errors = {
            name: provider.sources()[hub.key(name)].error or "" for name in ("many", "long", "path", "huge")
        }
        assert "lists more than 3 access providers" in errors["many"]
        assert "an argument is longer than 256 characters" in errors["long"]
        assert "certificate-authority (a file path) is refused" in errors["path"]
        assert "more than the limit of 16384; not read" in errors["huge"]
        for name, error in errors.items():
            assert error.startswith(f"ClusterProfile {hub.key(name)}"), error
            assert "x" * 300 not in error
        assert provider.clusters.names() == [hub.key("good")]


async def test_a_hub_without_the_crd_is_waited_for_and_the_manager_keeps_running(
    fresh_cluster: ControlPlane, fleet: Fleet, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    impatient = mcr.Manager(
        ClusterProfileProvider(admin_config(fresh_cluster), access_config(), wait_for_crd=False),
        handle_signals=False,
    )
    with pytest.raises(
        ClusterProfileNotInstalled, match=r"ClusterProfile API \(multicluster.x-k8s.io\) not installed"
    ):
        await impatient.start()
    provider = ClusterProfileProvider(
        admin_config(fresh_cluster),
        access_config(),
        namespace="late",
        options=CLUSTER_OPTIONS,
        probe_interval=PROBE_INTERVAL,
        crd_backoff=mcr.Backoff(base=0.1, cap=0.5),
    )
    caplog.set_level(logging.DEBUG, logger="mcruntime.follow")

    def looks() -> int:
        return sum(
            1
            for r in caplog.records
            if "ClusterProfile API (multicluster.x-k8s.io) not installed" in r.getMessage()
        )

    async with running(provider) as manager, mcr.Cluster("hub", admin_config(fresh_cluster)) as writer:
        await wait_until(lambda: looks() >= 3, what="the provider looked again a few times")
        waiting = provider.sources()["clusterprofiles.multicluster.x-k8s.io"]
        assert "not installed" in (waiting.error or "") and "waiting" in (waiting.error or "")
        assert waiting.kind == "CustomResourceDefinition" and waiting.cluster is None
        assert manager.clusters() == {}
        await install_crd(writer)
        await writer.client.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "late"}})
        late = Hub(fresh_cluster, writer, "late", tmp_path)
        await late.profile("m", Target.of(fleet["cluster-2"]))
        cluster = await provider.clusters.wait_engaged(late.key("m"))
        assert await manager.get_cluster(late.key("m")) is cluster
        assert provider.waiting is None and "clusterprofiles.multicluster.x-k8s.io" not in provider.sources()


async def test_a_broken_provider_file_fails_at_start_naming_the_file(hub: Hub, tmp_path: Path) -> None:
    path = tmp_path / "providers.json"
    path.write_text(json.dumps({"providers": [{"name": "x", "execConfig": {"command": "p"}}]}))
    manager = mcr.Manager(ClusterProfileProvider(admin_config(hub.plane), path), handle_signals=False)
    with pytest.raises(
        mcr.MCRuntimeError, match=r"providers\.json: providers\[0\] \('x'\)\.execConfig\.apiVersion"
    ):
        await manager.start()


async def test_the_plugin_reads_the_profiles_exec_extension_as_its_cluster_config(
    hub: Hub, fleet: Fleet
) -> None:
    """A shared plugin learns which cluster it serves from ``ExecCredential.spec.cluster.config``.

    The file's policies are left at Ignore: the profile adds no argument, only
    the standard ``client.authentication.k8s.io/exec`` extension, as the
    upstream secretreader plugin expects.
    """
    member = Target.of(fleet["cluster-2"])
    entry = hub.access_entry(member)
    credential = entry["cluster"]["extensions"][0]["extension"][1]
    entry["cluster"]["extensions"] = [{"name": EXEC_EXTENSION, "extension": {"credentialFile": credential}}]
    provider = hub.provider(access_config(args="Ignore"))
    async with running(provider):
        await hub.write("shared", status_of([entry]))
        cluster = await provider.clusters.wait_engaged(hub.key("shared"))
        await cluster.client.list(CONFIGMAP, namespace="default")
        assert await cluster.transport.authorization() == f"Bearer {member.token}"


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
