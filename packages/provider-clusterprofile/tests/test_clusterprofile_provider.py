"""ClusterProfileProvider against real control planes: a hub with our ClusterProfile CRD, members from the fleet.

Credentials come from ``token_plugin.py``, a real exec plugin run by the core,
which prints the credential kept in a file the profile names (KEP-5339
additional-args, allowed by the consumer's provider file).
"""

from __future__ import annotations

import json
import logging
import uuid
from pathlib import Path

import pytest
from clusterprofile_hub import ACCESS_NAME, CONFIGMAP, Hub, access_config, install_crd, running, status_of

import mcruntime as mcr
from mcruntime.testing import ControlPlane, Fleet, Target, admin_config, wait_until
from mcruntime.testing.conformance import CLUSTER_OPTIONS, PROBE_INTERVAL
from mcruntime_clusterprofile import (
    ADDITIONAL_ARGS_EXTENSION,
    ADDITIONAL_ENVS_EXTENSION,
    CLUSTER_MANAGER_LABEL,
    CLUSTER_PROFILE,
    EXEC_EXTENSION,
    ClusterProfileNotInstalled,
    ClusterProfileProvider,
)

# --- the ClusterProfile API's own edges ----------------------------------------------------------


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
