"""KubeFedProvider against real control planes: a hub with our own KubeFedCluster CRD, members from the fleet."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import uuid
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any, ClassVar

import pytest
import pytest_asyncio
from kube_helpers import CREDENTIAL_SHAPES, quotes_token, spoiled

import mcruntime as mcr
from mcruntime.testing import ControlPlane, Fleet, Target, admin_config, wait_until
from mcruntime.testing.conformance import (
    CLUSTER_OPTIONS,
    PROBE_INTERVAL,
    Capability,
    ProviderConformance,
    ProviderDriver,
)
from mcruntime_kubefed import (
    KUBEFED_CLUSTER,
    MAX_TOKEN_BYTES,
    KubeFedNotInstalled,
    KubeFedProvider,
    endpoint_url,
)

SECRET = mcr.Kind("v1", "Secret")
CRD = mcr.Kind("apiextensions.k8s.io/v1", "CustomResourceDefinition")
CONFIGMAP = mcr.Kind("v1", "ConfigMap")


KUBEFED_CRD: dict[str, Any] = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "kubefedclusters.core.kubefed.io"},
    "spec": {
        "group": "core.kubefed.io",
        "scope": "Namespaced",
        "names": {
            "plural": "kubefedclusters",
            "singular": "kubefedcluster",
            "kind": "KubeFedCluster",
            "listKind": "KubeFedClusterList",
        },
        "versions": [
            {
                "name": "v1beta1",
                "served": True,
                "storage": True,
                "subresources": {"status": {}},
                "schema": {
                    "openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
                },
            }
        ],
    },
}


async def install_kubefed_crd(cluster: mcr.Cluster) -> None:
    """Our own KubeFedCluster CRD (the schema keeps unknown fields), waited for until established."""
    with contextlib.suppress(mcr.AlreadyExists):
        await cluster.client.create(KUBEFED_CRD)

    async def established() -> bool:
        crd = await cluster.client.get(CRD, "kubefedclusters.core.kubefed.io")
        conditions = (crd.get("status") or {}).get("conditions") or []
        return any(c.get("type") == "Established" and c.get("status") == "True" for c in conditions)

    await wait_until(established, what="the KubeFedCluster CRD is established")


class Hub:
    """A KubeFed namespace of its own on the hub, and the writes kubefedctl would make."""

    def __init__(self, plane: ControlPlane, writer: mcr.Cluster, namespace: str) -> None:
        self.plane, self.writer, self.namespace = plane, writer, namespace
        self.written: dict[str, tuple[str, str | None] | None] = {}  # name -> (object RV, secret RV)

    async def join(
        self,
        name: str,
        target: Target,
        *,
        endpoint: str | None = None,
        ca: bytes | None = None,
        disabled: list[str] | None = None,
        annotations: dict[str, str] | None = None,
    ) -> None:
        secret_rv = await self.write_token(name, target.token or "")
        spec: dict[str, Any] = {
            "apiEndpoint": endpoint if endpoint is not None else target.server,
            "caBundle": base64.b64encode(target.ca_pem if ca is None else ca).decode(),
            "secretRef": {"name": f"{name}-token"},
        }
        if disabled is not None:
            spec["disabledTLSValidations"] = disabled
        manifest = {
            "apiVersion": KUBEFED_CLUSTER.api_version,
            "kind": "KubeFedCluster",
            "metadata": {"name": name, "namespace": self.namespace, "annotations": annotations or {}},
            "spec": spec,
        }
        applied = await self.writer.client.apply(manifest, field_manager="kubefedctl", force=True)
        self.written[name] = (applied["metadata"]["resourceVersion"], secret_rv)

    async def write_token(self, name: str, token: str | bytes, *, key: str = "token") -> str:
        """The member's token Secret, holding ``token`` under ``key`` (the provider reads ``token``)."""
        raw = token if isinstance(token, bytes) else token.encode()
        secret = {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": f"{name}-token", "namespace": self.namespace},
            "data": {key: base64.b64encode(raw).decode()},
        }
        # Applied: a key this manager set before and sets no more (another ``key``) is removed.
        applied = await self.writer.client.apply(secret, field_manager="kubefedctl", force=True)
        return self._secret_written(name, applied)

    async def touch_token(self, name: str, touch: str) -> str:
        """Change the token Secret's metadata only: an event, with the same token."""
        patch = {"metadata": {"annotations": {"touched": touch}}}
        patched = await self.writer.client.patch(SECRET, f"{name}-token", patch, namespace=self.namespace)
        return self._secret_written(name, patched)

    def _secret_written(self, name: str, secret: Mapping[str, Any]) -> str:
        version = str(secret["metadata"]["resourceVersion"])
        if self.written.get(name):
            object_rv, _ = self.written[name]  # type: ignore[misc]
            self.written[name] = (object_rv, version)
        return version

    async def unjoin(self, name: str) -> None:
        """kubefedctl's order: the Secret first, then the KubeFedCluster."""
        await self.writer.client.delete(SECRET, f"{name}-token", namespace=self.namespace)
        await self.writer.client.delete(KUBEFED_CLUSTER, name, namespace=self.namespace)
        self.written[name] = None

    def provider(self, **options: Any) -> KubeFedProvider:
        options.setdefault("options", CLUSTER_OPTIONS)
        options.setdefault("probe_interval", PROBE_INTERVAL)
        return KubeFedProvider(admin_config(self.plane), namespace=self.namespace, **options)

    async def settled(self, provider: KubeFedProvider) -> None:
        def caught_up() -> bool:
            seen = provider.sources()
            for name, versions in self.written.items():
                status = seen.get(name)
                if versions is None:
                    if status is not None:
                        return False
                elif status is None or (status.version, status.detail.get("secret_version")) != versions:
                    return False
            return True

        await wait_until(caught_up, what="the provider processed every write")


@pytest_asyncio.fixture
async def hub(fleet: Fleet) -> AsyncIterator[Hub]:
    plane = fleet["cluster-1"]
    async with mcr.Cluster("kubefedctl", admin_config(plane)) as writer:
        await install_kubefed_crd(writer)
        namespace = f"kubefed-{uuid.uuid4().hex[:8]}"
        await writer.client.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
        yield Hub(plane, writer, namespace)


# --- the conformance suite -------------------------------------------------------------------


class KubeFedDriver(ProviderDriver):
    """The source is a KubeFed namespace of the hub: one KubeFedCluster and token Secret per cluster."""

    unsupported: ClassVar[dict[Capability, str]] = {
        Capability.DUPLICATE_NAMES: "a member's name is its KubeFedCluster's name, unique in the namespace",
    }

    def __init__(self, hub: Hub) -> None:
        self.hub = hub
        self.provider: KubeFedProvider | None = None
        self.touches = 0

    def build(self) -> mcr.Provider:
        self.provider = self.hub.provider()
        return self.provider

    def status(self, name: str) -> mcr.ClusterStatus | None:
        return self.provider.statuses().get(name) if self.provider is not None else None

    async def add(self, name: str, target: Target) -> None:
        await self.hub.join(name, target)

    async def change_credential(self, name: str, target: Target) -> None:
        await self.hub.write_token(name, target.token or "")

    async def touch(self, name: str, target: Target) -> None:
        self.touches += 1
        await self.hub.join(
            name, target, annotations={"conformance.mcruntime.dev/touched": str(self.touches)}
        )

    async def corrupt(self, name: str) -> None:
        patched = await self.hub.writer.client.patch(
            KUBEFED_CLUSTER, name, {"spec": {"caBundle": "not base64!"}}, namespace=self.hub.namespace
        )
        written = self.hub.written[name]
        assert written is not None
        self.hub.written[name] = (patched["metadata"]["resourceVersion"], written[1])

    async def remove(self, name: str) -> None:
        await self.hub.unjoin(name)

    async def settle(self) -> None:
        assert self.provider is not None
        await self.hub.settled(self.provider)


class TestKubeFedProviderConformance(ProviderConformance):
    @pytest.fixture
    def driver(self, hub: Hub) -> ProviderDriver:
        return KubeFedDriver(hub)


# --- KubeFed's own edges ---------------------------------------------------------------------


def _manager(provider: KubeFedProvider) -> mcr.Manager:
    manager = mcr.Manager(provider, handle_signals=False)
    mcr.controller_managed_by(manager).named("noop").for_(CONFIGMAP, namespace="kube-system").complete(
        _nothing
    )
    return manager


async def _nothing(_request: mcr.Request) -> None:
    return None


@asynccontextmanager
async def _running(manager: mcr.Manager) -> AsyncIterator[mcr.Manager]:
    task = asyncio.create_task(manager.start())
    try:
        async with asyncio.timeout(30):
            await manager.wait_started()
        yield manager
    finally:
        manager.stop()
        await task


async def test_join_engages_and_a_rotated_token_is_used(hub: Hub, fleet: Fleet) -> None:
    member = fleet["cluster-2"]
    first = member.add_token_user(f"kubefed-{uuid.uuid4().hex[:6]}")
    provider = hub.provider()
    async with _running(_manager(provider)) as manager:
        await hub.join("east", Target.of(member, first))
        cluster = await provider.clusters.wait_engaged("east")
        assert await cluster.transport.authorization() == f"Bearer {first.token}"
        second = member.add_token_user(f"kubefed-{uuid.uuid4().hex[:6]}")
        await hub.write_token("east", second.token or "")
        await hub.settled(provider)
        assert await manager.get_cluster("east") is cluster  # rotated in place
        await cluster.client.list(CONFIGMAP, namespace="default")
        assert await cluster.transport.authorization() == f"Bearer {second.token}"


async def test_the_unjoin_order_disengages_the_member(hub: Hub, fleet: Fleet) -> None:
    provider = hub.provider()
    async with _running(_manager(provider)) as manager:
        await hub.join("gone", Target.of(fleet["cluster-2"]))
        cluster = await provider.clusters.wait_engaged("gone")
        await hub.unjoin("gone")
        await hub.settled(provider)
        await wait_until(lambda: "gone" not in manager.clusters(), what="the member is disengaged")
        assert cluster.stopped
        with pytest.raises(mcr.ClusterNotFound):
            await provider.get("gone")


async def test_a_secret_deleted_alone_keeps_the_member_on_its_last_token(hub: Hub, fleet: Fleet) -> None:
    provider = hub.provider()
    async with _running(_manager(provider)):
        await hub.join("kept", Target.of(fleet["cluster-2"]))
        cluster = await provider.clusters.wait_engaged("kept")
        await hub.writer.client.delete(SECRET, "kept-token", namespace=hub.namespace)

        def reported() -> bool:
            status = provider.sources().get("kept")
            return status is not None and status.stale and "missing" in (status.error or "")

        await wait_until(reported, what="the missing Secret is reported")
        assert await provider.get("kept") is cluster


async def test_a_wrong_ca_is_unhealthy_and_the_others_are_unaffected(hub: Hub, fleet: Fleet) -> None:
    provider = hub.provider()
    async with _running(_manager(provider)):
        await hub.join("good", Target.of(fleet["cluster-2"]))
        await hub.join("wrong-ca", Target.of(fleet["cluster-3"]), ca=fleet["cluster-2"].ca.cert_pem)
        await wait_until(
            lambda: (
                (s := provider.statuses().get("wrong-ca")) is not None
                and s.phase is mcr.ClusterPhase.UNHEALTHY
            ),
            what="wrong-ca is unhealthy",
        )
        await wait_until(
            lambda: (s := provider.statuses().get("good")) is not None and s.phase is mcr.ClusterPhase.READY,
            what="good is ready",
        )
        assert "wrong-ca" in provider.clusters.names()  # unhealthy is not gone


async def test_an_endpoint_without_a_scheme_gets_https(hub: Hub, fleet: Fleet) -> None:
    member = fleet["cluster-3"]
    assert endpoint_url("10.0.0.1:6443") == "https://10.0.0.1:6443"
    assert endpoint_url("https://api.example:443/") == "https://api.example:443"
    provider = hub.provider()
    async with _running(_manager(provider)):
        await hub.join("bare", Target.of(member), endpoint=member.server.removeprefix("https://"))
        cluster = await provider.clusters.wait_engaged("bare")
        assert cluster.config.server == member.server
        await wait_until(
            lambda: (s := provider.statuses().get("bare")) is not None and s.phase is mcr.ClusterPhase.READY,
            what="bare is ready",
        )


async def test_disabled_tls_validation_needs_an_explicit_opt_in(
    hub: Hub, fleet: Fleet, caplog: pytest.LogCaptureFixture
) -> None:
    member = fleet["cluster-2"]
    refusing = hub.provider()
    async with _running(_manager(refusing)):
        await hub.join("insecure", Target.of(member), disabled=["*"])
        await hub.join("subject", Target.of(member), disabled=["SubjectName"])
        await hub.settled(refusing)
        statuses = refusing.sources()
        assert not statuses["insecure"].engaged and "allow_insecure" in (statuses["insecure"].error or "")
        assert not statuses["subject"].engaged and "not supported" in (statuses["subject"].error or "")
        assert refusing.clusters.names() == []
        failed = refusing.statuses()["insecure"]  # never engaged: failed, with its object
        assert failed.phase is mcr.ClusterPhase.FAILED and failed.source == statuses["insecure"]
    caplog.set_level(logging.WARNING, logger="mcruntime_kubefed")
    accepting = hub.provider(allow_insecure=True)
    async with _running(_manager(accepting)):
        cluster = await accepting.clusters.wait_engaged("insecure")
        assert cluster.config.insecure
        await cluster.client.list(CONFIGMAP, namespace="default")
    assert "TLS verification is off" in caplog.text


async def test_wait_for_ready_holds_back_members_until_kubefed_says_ready(hub: Hub, fleet: Fleet) -> None:
    provider = hub.provider(wait_for_ready=True)
    async with _running(_manager(provider)):
        await hub.join("later", Target.of(fleet["cluster-2"]))
        await hub.settled(provider)
        assert provider.clusters.names() == []
        waiting = provider.sources()["later"]  # held back is waiting, not failed
        assert waiting.error is None and "Ready" in waiting.detail["waiting"] and not waiting.engaged
        assert "later" not in provider.statuses()
        status = {"conditions": [{"type": "Ready", "status": "True", "reason": "ClusterReady"}]}
        await hub.writer.client.patch(
            KUBEFED_CLUSTER, "later", {"status": status}, namespace=hub.namespace, subresource="status"
        )
        await provider.clusters.wait_engaged("later")


async def test_a_hub_without_kubefed_is_waited_for_and_the_manager_keeps_running(
    fresh_cluster: ControlPlane, fleet: Fleet, caplog: pytest.LogCaptureFixture
) -> None:
    # Asked to fail fast, the provider still says clearly what is missing.
    with pytest.raises(KubeFedNotInstalled, match="KubeFed not installed"):
        await _manager(KubeFedProvider(admin_config(fresh_cluster), wait_for_crd=False)).start()
    # By default it waits, says so once, and engages a member once KubeFed is installed.
    caplog.set_level(logging.DEBUG, logger="mcruntime.follow")

    def said(level: int) -> int:
        return sum(
            1 for r in caplog.records if r.levelno == level and "KubeFed not installed" in r.getMessage()
        )

    provider = KubeFedProvider(
        admin_config(fresh_cluster),
        namespace="federation",
        options=CLUSTER_OPTIONS,
        probe_interval=PROBE_INTERVAL,
        crd_backoff=mcr.Backoff(base=0.1, cap=0.5),
    )
    async with (
        _running(_manager(provider)) as manager,
        mcr.Cluster("kubefedctl", admin_config(fresh_cluster)) as writer,
    ):
        await wait_until(lambda: said(logging.DEBUG) >= 3, what="the provider looked again a few times")
        assert "KubeFed not installed" in (provider.waiting or "")
        crd = provider.sources()["kubefedclusters.core.kubefed.io"]  # reported where every problem is
        assert crd.error == provider.waiting and crd.cluster is None
        assert said(logging.WARNING) == 1  # one line for the whole wait, not one per look
        assert manager.clusters() == {}
        await install_kubefed_crd(writer)
        await writer.client.create(
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "federation"}}
        )
        await Hub(fresh_cluster, writer, "federation").join("late", Target.of(fleet["cluster-2"]))
        cluster = await provider.clusters.wait_engaged("late")
        assert await manager.get_cluster("late") is cluster
        assert provider.waiting is None and "kubefedclusters.core.kubefed.io" not in provider.sources()


async def test_an_oversized_token_is_refused_and_named(hub: Hub, fleet: Fleet) -> None:
    provider = hub.provider()
    async with _running(_manager(provider)):
        await hub.join("good", Target.of(fleet["cluster-2"]))
        await hub.join("huge", Target.of(fleet["cluster-3"]))
        await hub.write_token("huge", "x" * (MAX_TOKEN_BYTES + 1))
        await hub.settled(provider)
        error = provider.sources()["huge"].error or ""
        assert f"Secret {hub.namespace}/huge-token key 'token'" in error
        assert f"limit of {MAX_TOKEN_BYTES} bytes" in error
        await provider.clusters.wait_engaged("good")


async def test_a_token_secret_that_cannot_be_used_says_what_is_wrong_with_it(hub: Hub, fleet: Fleet) -> None:
    """Each was reported as "missing or has no 'token'", though kubectl shows the Secret and its key."""
    member = fleet["cluster-2"]
    shapes: dict[str, tuple[bytes, str]] = {
        "binary": (
            b"\xff\xfe-not-utf8",
            "key 'token' is not UTF-8 text (byte 0 of 11): a bearer token is text",
        ),
        "blank": (b" \n\t", "key 'token' holds only whitespace"),
        "empty": (b"", "key 'token' is empty"),
    }
    for name, (raw, _said) in shapes.items():
        await hub.join(name, Target.of(member))
        await hub.write_token(name, raw)
    await hub.join("elsewhere", Target.of(member))
    await hub.write_token(
        "elsewhere", member.token_user.token or "", key="ca.crt"
    )  # the token under another key
    await hub.join("gone", Target.of(member))
    await hub.writer.client.delete(SECRET, "gone-token", namespace=hub.namespace)
    joined = hub.written["gone"]
    assert joined is not None
    hub.written["gone"] = (joined[0], None)  # the object as written, and no Secret
    provider = hub.provider()
    async with _running(_manager(provider)):
        await hub.settled(provider)
        errors = {name: provider.sources()[name].error for name in [*shapes, "elsewhere", "gone"]}
        for name, (_raw, said) in shapes.items():
            assert errors[name] == f"Secret {hub.namespace}/{name}-token {said}", errors
        assert errors["elsewhere"] == f"Secret {hub.namespace}/elsewhere-token has no key 'token'", errors
        assert errors["gone"] == f"Secret {hub.namespace}/gone-token is missing", errors
        assert provider.clusters.names() == []


async def test_tls_verification_off_is_logged_once_per_member_and_again_when_it_changes(
    hub: Hub, fleet: Fleet, caplog: pytest.LogCaptureFixture
) -> None:
    """Every Secret event made a pass, and every pass logged the warning again."""
    caplog.set_level(logging.WARNING, logger="mcruntime_kubefed")
    member = fleet["cluster-2"]

    def warnings() -> int:
        return sum(
            "KubeFedCluster insecure: TLS verification is off for this member" in record.getMessage()
            for record in caplog.records
        )

    provider = hub.provider(allow_insecure=True)
    async with _running(_manager(provider)):
        await hub.join("insecure", Target.of(member), disabled=["*"])
        await provider.clusters.wait_engaged("insecure")
        await hub.settled(provider)
        for touch in range(5):  # each an event, so a pass over every member
            await hub.write_token(f"unrelated-{touch}", "t")
            await hub.touch_token("insecure", str(touch))
            await hub.settled(provider)
        assert warnings() == 1
        await hub.join("insecure", Target.of(member))  # verified again: nothing to warn of
        await hub.settled(provider)
        await hub.join("insecure", Target.of(member), disabled=["*"])  # and off again: warned again
        await hub.settled(provider)
        await hub.touch_token("insecure", "after")
        await hub.settled(provider)
        assert warnings() == 2


async def test_token_secrets_echoed_are_used_and_spoiled_ones_name_their_secret(
    hub: Hub, fleet: Fleet, caplog: pytest.LogCaptureFixture
) -> None:
    """A token Secret is a token file by another name: stripped, as kubefedctl's readers strip it."""
    caplog.set_level(logging.INFO)
    member = fleet["cluster-2"]
    token = member.token_user.token
    # Written before the provider starts, so it never sees a good token first (which it would keep).
    await hub.join("echoed", Target.of(member))
    await hub.write_token("echoed", f"{token}\n")  # what `echo $TOKEN | kubectl create secret` gives
    for shape in ("control-character", "non-ascii"):
        await hub.join(shape, Target.of(member))
        await hub.write_token(shape, spoiled(token, shape))
    provider = hub.provider()
    async with _running(_manager(provider)):
        await hub.settled(provider)
        cluster = await provider.clusters.wait_engaged("echoed")
        assert await cluster.transport.authorization() == f"Bearer {token}"
        for shape in ("control-character", "non-ascii"):
            error = provider.sources()[shape].error or ""
            assert f"(token from Secret {hub.namespace}/{shape}-token key 'token')" in error, error
            assert CREDENTIAL_SHAPES[shape][1] in error
            assert provider.statuses()[shape].phase is mcr.ClusterPhase.FAILED
        exposed = caplog.text + repr(provider.sources()) + repr(provider.statuses())
        assert not quotes_token(exposed, token)
