"""ClusterAPIProvider against real control planes: a hub with a Cluster CRD of our own, workloads from the fleet."""

from __future__ import annotations

import base64
import contextlib
import logging
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, ClassVar

import pytest
import pytest_asyncio
import yaml
from kube_helpers import CREDENTIAL_SHAPES, create_again, quotes_token, spoiled

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
from mcruntime_capi import CLUSTER_NAME_LABEL, ClusterAPINotInstalled, ClusterAPIProvider

SECRET = mcr.Kind("v1", "Secret")
CRD = mcr.Kind("apiextensions.k8s.io/v1", "CustomResourceDefinition")
CONFIGMAP = mcr.Kind("v1", "ConfigMap")
V1BETA2 = mcr.Kind("cluster.x-k8s.io/v1beta2", "Cluster")
V1BETA1 = mcr.Kind("cluster.x-k8s.io/v1beta1", "Cluster")


def cluster_crd(versions: tuple[str, ...]) -> dict[str, Any]:
    """Our own Cluster CRD: the given versions, the last one stored, unknown fields kept."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "clusters.cluster.x-k8s.io"},
        "spec": {
            "group": "cluster.x-k8s.io",
            "scope": "Namespaced",
            "names": {
                "plural": "clusters",
                "singular": "cluster",
                "kind": "Cluster",
                "listKind": "ClusterList",
            },
            "versions": [
                {
                    "name": version,
                    "served": True,
                    "storage": version == versions[0],
                    "subresources": {"status": {}},
                    "schema": {
                        "openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
                    },
                }
                for version in versions
            ],
        },
    }


async def install_crd(cluster: mcr.Cluster, versions: tuple[str, ...]) -> None:
    with contextlib.suppress(mcr.AlreadyExists):
        await cluster.client.create(cluster_crd(versions))

    async def established() -> bool:
        crd = await cluster.client.get(CRD, "clusters.cluster.x-k8s.io")
        conditions = (crd.get("status") or {}).get("conditions") or []
        return any(c.get("type") == "Established" and c.get("status") == "True" for c in conditions)

    await wait_until(established, what="the Cluster CRD is established")


class Hub:
    """A namespace of the management cluster, and the writes Cluster API would make there."""

    def __init__(
        self, plane: ControlPlane, writer: mcr.Cluster, namespace: str, kind: mcr.Kind = V1BETA2
    ) -> None:
        self.plane, self.writer, self.namespace, self.kind = plane, writer, namespace, kind
        self.written: dict[str, tuple[str, str | None] | None] = {}

    def key(self, name: str) -> str:
        return f"{self.namespace}/{name}"

    async def create_cluster(
        self, name: str, *, ready: bool, annotations: dict[str, str] | None = None
    ) -> None:
        manifest = {
            "apiVersion": self.kind.api_version,
            "kind": "Cluster",
            "metadata": {"name": name, "namespace": self.namespace, "annotations": annotations or {}},
            "spec": {"controlPlaneEndpoint": {"host": "127.0.0.1", "port": 6443}},
        }
        applied = await self.writer.client.apply(manifest, field_manager="capi", force=True)
        if ready:
            applied = await self.set_ready(name)
        previous = self.written.get(name)
        self.written[name] = (applied["metadata"]["resourceVersion"], previous[1] if previous else None)

    async def set_ready(self, name: str) -> dict[str, Any]:
        if self.kind == V1BETA2:
            status: dict[str, Any] = {
                "initialization": {"controlPlaneInitialized": True},
                "phase": "Provisioned",
            }
        else:
            status = {"controlPlaneReady": True, "phase": "Provisioned"}
        updated = await self.writer.client.patch(
            self.kind, name, {"status": status}, namespace=self.namespace, subresource="status"
        )
        previous = self.written.get(name)
        self.written[name] = (updated["metadata"]["resourceVersion"], previous[1] if previous else None)
        return updated

    async def write_secret(self, name: str, kubeconfig: Any, *, key: str = "value") -> None:
        text = kubeconfig if isinstance(kubeconfig, str) else yaml.safe_dump(kubeconfig)
        manifest = {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {
                "name": f"{name}-kubeconfig",
                "namespace": self.namespace,
                "labels": {CLUSTER_NAME_LABEL: name},
            },
            "type": "cluster.x-k8s.io/secret",
            "data": {key: base64.b64encode(text.encode()).decode()},
        }
        applied = await self.writer.client.apply(manifest, field_manager="capi", force=True)
        previous = self.written.get(name)
        self.written[name] = (previous[0] if previous else "", applied["metadata"]["resourceVersion"])

    async def delete_cluster(self, name: str) -> None:
        await self.writer.client.delete(self.kind, name, namespace=self.namespace)
        self.written[name] = None

    def provider(self, **options: Any) -> ClusterAPIProvider:
        options.setdefault("options", CLUSTER_OPTIONS)
        options.setdefault("probe_interval", PROBE_INTERVAL)
        return ClusterAPIProvider(admin_config(self.plane), namespace=self.namespace, **options)

    async def settled(self, provider: ClusterAPIProvider) -> None:
        def caught_up() -> bool:
            seen = provider.sources()
            for name, versions in self.written.items():
                status = seen.get(self.key(name))
                if versions is None:
                    if status is not None:
                        return False
                elif (
                    status is None
                    or status.version != versions[0]
                    or (versions[1] is not None and status.detail.get("secret_version") != versions[1])
                ):
                    return False
            return True

        await wait_until(caught_up, what="the provider processed every write")


@pytest_asyncio.fixture
async def hub(fleet: Fleet) -> AsyncIterator[Hub]:
    plane = fleet["cluster-1"]
    async with mcr.Cluster("capi", admin_config(plane)) as writer:
        await install_crd(writer, ("v1beta2", "v1beta1"))
        namespace = f"capi-{uuid.uuid4().hex[:8]}"
        await writer.client.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
        yield Hub(plane, writer, namespace)


# --- the conformance suite -------------------------------------------------------------------


class CapiDriver(ProviderDriver):
    """The source is a namespace of the hub: a ready Cluster and its kubeconfig Secret per cluster."""

    unsupported: ClassVar[dict[Capability, str]] = {
        Capability.DUPLICATE_NAMES: "names are <namespace>/<name> of Cluster objects, unique by construction",
    }

    def __init__(self, hub: Hub) -> None:
        self.hub = hub
        self.provider: ClusterAPIProvider | None = None
        self.touches = 0

    def build(self) -> mcr.Provider:
        self.provider = self.hub.provider()
        return self.provider

    def engaged_name(self, name: str) -> str:
        return self.hub.key(name)

    def status(self, name: str) -> mcr.ClusterStatus | None:
        return self.provider.statuses().get(self.hub.key(name)) if self.provider is not None else None

    async def add(self, name: str, target: Target) -> None:
        await self.hub.write_secret(name, target.kubeconfig())
        await self.hub.create_cluster(name, ready=True)

    async def change(self, name: str, target: Target) -> None:
        await self.hub.write_secret(name, target.kubeconfig())

    async def touch(self, name: str, target: Target) -> None:
        self.touches += 1
        await self.hub.create_cluster(name, ready=True, annotations={"touched": str(self.touches)})

    async def corrupt(self, name: str) -> None:
        await self.hub.write_secret(name, "clusters: [unclosed\n")  # a bad edit: no YAML

    async def remove(self, name: str) -> None:
        await self.hub.delete_cluster(name)

    async def settle(self) -> None:
        assert self.provider is not None
        await self.hub.settled(self.provider)


class TestClusterAPIProviderConformance(ProviderConformance):
    @pytest.fixture
    def driver(self, hub: Hub) -> ProviderDriver:
        return CapiDriver(hub)


# --- Cluster API's own edges --------------------------------------------------------------------


async def _nothing(_request: mcr.Request) -> None:
    return None


@asynccontextmanager
async def running(provider: ClusterAPIProvider) -> AsyncIterator[mcr.Manager]:
    manager = mcr.Manager(provider, handle_signals=False)
    mcr.controller_managed_by(manager).named("noop").for_(CONFIGMAP, namespace="kube-system").complete(
        _nothing
    )
    async with run_manager(manager, tasks_must_end=False):
        yield manager


async def test_a_cluster_is_engaged_once_ready_even_if_its_secret_comes_later(hub: Hub, fleet: Fleet) -> None:
    provider = hub.provider()
    async with running(provider):
        await hub.create_cluster("w1", ready=False)
        await hub.write_secret("w1", fleet["cluster-2"].kubeconfig(fleet["cluster-2"].token_user))
        await hub.settled(provider)
        assert provider.clusters.names() == []
        waiting = provider.sources()[hub.key("w1")]  # not ready is waiting: no error, not a failed cluster
        assert (
            waiting.detail["ready"] == "false"
            and waiting.error is None
            and "initialized" in waiting.detail["waiting"]
        )
        assert hub.key("w1") not in provider.statuses()
        await hub.set_ready("w1")
        cluster = await provider.clusters.wait_engaged(hub.key("w1"))
        await cluster.client.list(CONFIGMAP, namespace="default")
        # Ready first, Secret later:
        await hub.create_cluster("w2", ready=True)
        await hub.settled(provider)
        assert "does not exist" in (provider.sources()[hub.key("w2")].error or "")
        failed = provider.statuses()[hub.key("w2")]
        assert failed.phase is mcr.ClusterPhase.FAILED and failed.source == provider.sources()[hub.key("w2")]
        await hub.write_secret("w2", fleet["cluster-3"].kubeconfig(fleet["cluster-3"].token_user))
        await provider.clusters.wait_engaged(hub.key("w2"))


async def test_a_readiness_check_that_fails_is_the_clusters_error_named_once(
    hub: Hub, fleet: Fleet, caplog: pytest.LogCaptureFixture
) -> None:
    # It was a WARNING on every pass that named no Cluster, and the source said "waiting".
    def broken(obj: Any, api_version: str) -> bool:
        return bool(obj["status"]["no-such-field"])

    provider = hub.provider(ready=broken)
    async with running(provider):
        await hub.create_cluster("odd", ready=True)
        await hub.write_secret("odd", fleet["cluster-2"].kubeconfig(fleet["cluster-2"].token_user))
        await hub.settled(provider)
        await hub.write_secret("odd", fleet["cluster-3"].kubeconfig(fleet["cluster-3"].token_user))
        await hub.settled(provider)  # a second pass over the same failing check
        source = provider.sources()[hub.key("odd")]
    assert source.error == "the readiness check failed: KeyError: 'no-such-field'"
    assert "waiting" not in source.detail and provider.clusters.names() == []
    said = [r.getMessage() for r in caplog.records if "readiness check failed" in r.getMessage()]
    assert len(said) == 1 and hub.key("odd") in said[0]


async def test_a_rotated_secret_is_followed(hub: Hub, fleet: Fleet) -> None:
    plane = fleet["cluster-2"]
    before, after = (
        plane.add_token_user(f"capi-{uuid.uuid4().hex[:6]}"),
        plane.add_token_user(f"capi-{uuid.uuid4().hex[:6]}"),
    )
    provider = hub.provider()
    async with running(provider) as manager:
        await hub.write_secret("rot", plane.kubeconfig(before))
        await hub.create_cluster("rot", ready=True)
        cluster = await provider.clusters.wait_engaged(hub.key("rot"))
        await hub.write_secret("rot", plane.kubeconfig(after))
        await hub.settled(provider)
        assert await manager.get_cluster(hub.key("rot")) is cluster  # token swapped in place
        assert await cluster.transport.authorization() == f"Bearer {after.token}"


async def test_deletion_and_a_held_deletion_both_disengage(hub: Hub, fleet: Fleet) -> None:
    provider = hub.provider()
    async with running(provider) as manager:
        for name in ("plain", "held"):
            await hub.write_secret(name, fleet["cluster-2"].kubeconfig(fleet["cluster-2"].token_user))
            await hub.create_cluster(name, ready=True)
            await provider.clusters.wait_engaged(hub.key(name))
        await hub.writer.client.patch(
            V1BETA2,
            "held",
            {"metadata": {"finalizers": ["cluster.cluster.x-k8s.io"]}},
            namespace=hub.namespace,
        )
        await hub.writer.client.delete(V1BETA2, "held", namespace=hub.namespace)  # stays, deleting
        await hub.delete_cluster("plain")
        await wait_until(
            lambda: not ({hub.key("plain"), hub.key("held")} & set(manager.clusters())), what="both let go"
        )
        await hub.writer.client.patch(
            V1BETA2, "held", {"metadata": {"finalizers": None}}, namespace=hub.namespace
        )


async def test_a_secret_without_value_is_reported_and_harms_no_one(hub: Hub, fleet: Fleet) -> None:
    provider = hub.provider()
    async with running(provider):
        await hub.write_secret("good", fleet["cluster-2"].kubeconfig(fleet["cluster-2"].token_user))
        await hub.create_cluster("good", ready=True)
        await hub.write_secret("bad", fleet["cluster-3"].kubeconfig(), key="wrong-key")
        await hub.create_cluster("bad", ready=True)
        await hub.settled(provider)
        assert "has no key 'value'" in (provider.sources()[hub.key("bad")].error or "")
        await provider.clusters.wait_engaged(hub.key("good"))
        assert hub.key("bad") not in provider.clusters.names()


async def test_two_clusters_with_one_name_in_two_namespaces(hub: Hub, fleet: Fleet) -> None:
    other = Hub(hub.plane, hub.writer, f"capi-{uuid.uuid4().hex[:8]}")
    await hub.writer.client.create(
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": other.namespace}}
    )
    provider = ClusterAPIProvider(
        admin_config(hub.plane), options=CLUSTER_OPTIONS, probe_interval=PROBE_INTERVAL
    )
    async with running(provider):
        for source, plane in ((hub, fleet["cluster-2"]), (other, fleet["cluster-3"])):
            await source.write_secret("same", plane.kubeconfig(plane.token_user))
            await source.create_cluster("same", ready=True)
        first = await provider.clusters.wait_engaged(hub.key("same"))
        second = await provider.clusters.wait_engaged(other.key("same"))
        assert first.config.server == fleet["cluster-2"].server
        assert second.config.server == fleet["cluster-3"].server


async def test_a_hub_serving_only_v1beta1_is_read_in_v1beta1(
    fresh_cluster: ControlPlane, fleet: Fleet
) -> None:
    async with mcr.Cluster("capi", admin_config(fresh_cluster)) as writer:
        await install_crd(writer, ("v1beta1",))
        await writer.client.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "legacy"}})
        legacy = Hub(fresh_cluster, writer, "legacy", kind=V1BETA1)
        provider = legacy.provider()
        async with running(provider):
            await legacy.write_secret("old", fleet["cluster-2"].kubeconfig(fleet["cluster-2"].token_user))
            await legacy.create_cluster("old", ready=True)
            await provider.clusters.wait_engaged(legacy.key("old"))
            assert provider.api_version == "cluster.x-k8s.io/v1beta1"


async def test_a_hub_without_cluster_api_is_waited_for_and_the_manager_keeps_running(
    fresh_cluster: ControlPlane, fleet: Fleet, caplog: pytest.LogCaptureFixture
) -> None:
    # Asked to fail fast, the provider still says clearly what is missing.
    impatient = mcr.Manager(
        ClusterAPIProvider(admin_config(fresh_cluster), wait_for_crd=False), handle_signals=False
    )
    with pytest.raises(ClusterAPINotInstalled, match="Cluster API not installed"):
        await impatient.start()
    # By default it waits, says so, and engages once Cluster API is installed.
    provider = ClusterAPIProvider(
        admin_config(fresh_cluster),
        namespace="late",
        options=CLUSTER_OPTIONS,
        probe_interval=PROBE_INTERVAL,
        crd_backoff=mcr.Backoff(base=0.1, cap=0.5),
    )
    caplog.set_level(logging.DEBUG, logger="mcruntime.follow")

    def said(level: int) -> int:
        return sum(
            1 for r in caplog.records if r.levelno == level and "Cluster API not installed" in r.getMessage()
        )

    async with running(provider) as manager, mcr.Cluster("capi", admin_config(fresh_cluster)) as writer:
        await wait_until(lambda: said(logging.DEBUG) >= 3, what="the provider looked again a few times")
        assert "Cluster API not installed" in (provider.waiting or "")
        assert "waiting" in (provider.waiting or "")
        crd = provider.sources()["clusters.cluster.x-k8s.io"]  # reported where every problem is
        assert crd.error == provider.waiting and crd.cluster is None
        assert said(logging.WARNING) == 1  # one line for the whole wait, not one per look
        assert manager.clusters() == {}
        # The hub is shown waiting, never counted against /readyz: the wait is documented.
        waiting = provider.statuses()[f"hub:{provider.owner}"]
        assert waiting.phase is mcr.ClusterPhase.FAILED and "Cluster API not installed" in (
            waiting.error or ""
        )
        await install_crd(writer, ("v1beta2", "v1beta1"))
        await writer.client.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "late"}})
        late = Hub(fresh_cluster, writer, "late")
        await late.write_secret("w", fleet["cluster-2"].kubeconfig(fleet["cluster-2"].token_user))
        await late.create_cluster("w", ready=True)
        cluster = await provider.clusters.wait_engaged(late.key("w"))
        assert await manager.get_cluster(late.key("w")) is cluster
        assert provider.waiting is None and provider.api_version == "cluster.x-k8s.io/v1beta2"


async def test_cluster_api_uninstalled_while_running_is_named_until_it_is_back(
    fresh_cluster: ControlPlane, fleet: Fleet
) -> None:
    async with mcr.Cluster("capi", admin_config(fresh_cluster)) as writer:
        await install_crd(writer, ("v1beta2", "v1beta1"))
        await writer.client.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "gone"}})
        hub = Hub(fresh_cluster, writer, "gone")
        provider = hub.provider()
        name = f"hub:{provider.owner}"
        async with running(provider) as manager:
            await hub.write_secret("w", fleet["cluster-2"].kubeconfig(fleet["cluster-2"].token_user))
            await hub.create_cluster("w", ready=True)
            await provider.clusters.wait_engaged(hub.key("w"))
            assert name not in provider.statuses()
            await writer.client.delete(CRD, "clusters.cluster.x-k8s.io")
            # Its Clusters go with the CRD; then discovery itself is named, not only logged.
            await wait_until(lambda: name in provider.statuses(), what="the uninstalled kind named")
            gone = provider.statuses()[name]
            assert "Cluster (cluster.x-k8s.io/v1beta2) is no longer served" in (gone.error or ""), gone
            # Like the wait for a CRD not installed yet: shown, never counted against /readyz.
            assert gone.phase is mcr.ClusterPhase.FAILED, gone
            await wait_until(lambda: hub.key("w") not in manager.clusters(), what="its Cluster disengaged")

            await create_again(writer, cluster_crd(("v1beta2", "v1beta1")))
            await install_crd(writer, ("v1beta2", "v1beta1"))  # established

            async def recreated() -> bool:
                with contextlib.suppress(mcr.KindNotFound, mcr.NotFound):
                    await hub.create_cluster("w", ready=True)
                    return True
                await writer.client.discovery.refresh()
                return False

            await wait_until(recreated, what="the Cluster written again")
            await provider.clusters.wait_engaged(hub.key("w"))
            await wait_until(lambda: name not in provider.statuses(), what="the hub line gone")


async def test_a_hub_that_refuses_the_clusters_is_named_until_granted(hub: Hub, fleet: Fleet) -> None:
    await hub.write_secret("w", fleet["cluster-2"].kubeconfig(fleet["cluster-2"].token_user))
    await hub.create_cluster("w", ready=True)
    account = f"capi-refused-{uuid.uuid4().hex[:8]}"
    user = hub.plane.add_token_user(account, cluster_admin=False)
    config = mcr.kubeconfig_from_dict(hub.plane.kubeconfig(user), origin="refused hub")
    provider = ClusterAPIProvider(
        config, namespace=hub.namespace, options=CLUSTER_OPTIONS, probe_interval=PROBE_INTERVAL
    )
    name = f"hub:{provider.owner}"
    try:
        async with running(provider) as manager:
            await wait_until(lambda: name in provider.statuses(), what="the refused hub reported")
            refused = provider.statuses()[name]
            # Nothing engaged: it counts, and it names the verb, the kind and the namespace.
            assert refused.phase is mcr.ClusterPhase.UNHEALTHY, refused
            assert any("Cluster (clusters.cluster.x-k8s.io)" in m for m in refused.missing_permissions), (
                refused
            )
            rules = [
                {
                    "apiGroups": ["cluster.x-k8s.io"],
                    "resources": ["clusters"],
                    "verbs": ["get", "list", "watch"],
                },
                {"apiGroups": [""], "resources": ["secrets"], "verbs": ["get", "list", "watch"]},
            ]
            await hub.writer.client.create(
                {
                    "apiVersion": "rbac.authorization.k8s.io/v1",
                    "kind": "Role",
                    "metadata": {"name": "capi-reader", "namespace": hub.namespace},
                    "rules": rules,
                }
            )
            await hub.writer.client.create(
                {
                    "apiVersion": "rbac.authorization.k8s.io/v1",
                    "kind": "RoleBinding",
                    "metadata": {"name": "capi-reader", "namespace": hub.namespace},
                    "roleRef": {
                        "apiGroup": "rbac.authorization.k8s.io",
                        "kind": "Role",
                        "name": "capi-reader",
                    },
                    "subjects": [{"kind": "User", "name": user.name}],
                }
            )
            await provider.clusters.wait_engaged(hub.key("w"))
            assert hub.key("w") in manager.clusters()
            await wait_until(lambda: name not in provider.statuses(), timeout=30, what="the hub line gone")
    finally:
        hub.plane.revoke_token_user(account)


async def test_an_oversized_kubeconfig_secret_is_refused_unparsed_and_named(hub: Hub, fleet: Fleet) -> None:
    provider = hub.provider(max_kubeconfig_bytes=4096)
    async with running(provider):
        await hub.write_secret("good", fleet["cluster-2"].kubeconfig(fleet["cluster-2"].token_user))
        await hub.create_cluster("good", ready=True)
        await hub.write_secret("huge", "# padding\n" * 1000)  # 10 KB of YAML comments
        await hub.create_cluster("huge", ready=True)
        await hub.settled(provider)
        error = provider.sources()[hub.key("huge")].error or ""
        assert f"Secret {hub.key('huge')}-kubeconfig key 'value'" in error
        assert "limit of 4096 bytes" in error
        await provider.clusters.wait_engaged(hub.key("good"))
        assert hub.key("huge") not in provider.clusters.names()


@pytest.mark.parametrize("shape", sorted(CREDENTIAL_SHAPES))
async def test_a_token_that_cannot_be_sent_is_refused_naming_the_secret(
    hub: Hub, fleet: Fleet, shape: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    plane = fleet["cluster-2"]
    token = plane.token_user.token
    kubeconfig = plane.kubeconfig(plane.token_user)
    kubeconfig["users"][0]["user"]["token"] = spoiled(token, shape)
    provider = hub.provider()
    async with running(provider):
        await hub.write_secret("shaped", kubeconfig)
        await hub.create_cluster("shaped", ready=True)
        await hub.settled(provider)
        error = provider.sources()[hub.key("shaped")].error or ""
        assert (
            error.startswith(f"Secret {hub.key('shaped')}-kubeconfig")
            and CREDENTIAL_SHAPES[shape][1] in error
        )
        assert hub.key("shaped") not in provider.clusters.names()
        assert provider.statuses()[hub.key("shaped")].phase is mcr.ClusterPhase.FAILED
        exposed = caplog.text + repr(provider.sources()) + repr(provider.statuses())
        assert not quotes_token(exposed, token)
