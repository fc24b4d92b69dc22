"""The generated RBAC, applied as is, is all a controller needs; a rule missing is named, then recovers.

Run as it would be in a Pod: each cluster's identity is a real ServiceAccount
token from the TokenRequest API, written with the CA into a service-account
directory and loaded with ``in_cluster_config``; the API servers authorize with
RBAC, and the only permissions are the YAML ``rbac_for`` generated (applied to
the hub and to each member). The controller has job-fanout's shape: it watches
Widgets on the hub, writes a ConfigMap per Widget in every member, records the
members in the Widget's status and records an event.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import shutil
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from kube_helpers import CONFIGMAP, core_api, install_widget_crd, unique
from kubernetes_asyncio import client as k8s

import mcruntime as mcr
from mcruntime.rbac import RBAC
from mcruntime.testing import ControlPlane, Fleet, running, wait_until

HUB = "cluster-1"
MEMBERS = ("cluster-2", "cluster-3")
EVENT = mcr.Kind("events.k8s.io/v1", "Event")
RECOVERY = 120.0  # the informer's backoff is capped at 30 s; a restored rule shows within it


class Copier:
    """Copies each hub Widget into a ConfigMap in every member, and says where in its status."""

    def __init__(self, manager: mcr.Manager, widget: mcr.Kind, namespace: str) -> None:
        self.manager = manager
        self.widget = widget
        self.namespace = namespace
        self.recorder = manager.event_recorder("copier")
        (
            mcr.controller_managed_by(manager)
            .named("copier")
            .for_(widget, clusters=mcr.LOCAL_ONLY, namespace=namespace)
            .watches(
                CONFIGMAP,
                mcr.enqueue_mapped(self._widget_of),
                clusters=mcr.PROVIDER_ONLY,
                namespace=namespace,
            )
            .writes(CONFIGMAP, "create", "patch", clusters=mcr.PROVIDER_ONLY)
            .complete(self.reconcile)
        )

    def _widget_of(self, _cluster: str, obj: dict[str, Any]) -> list[mcr.Request]:
        meta = obj["metadata"]
        return [mcr.Request(mcr.LOCAL_CLUSTER, meta["namespace"], meta["name"])]

    async def reconcile(self, request: mcr.Request) -> None:
        hub = await self.manager.get_cluster(mcr.LOCAL_CLUSTER)
        widget = await hub.cache.get_or_none(self.widget, request.name, namespace=request.namespace)
        if widget is None:
            return
        copied: list[str] = []
        failures: list[mcr.APIError] = []
        for name, cluster in sorted(self.manager.clusters().items()):
            if name == mcr.LOCAL_CLUSTER:
                continue
            copy = {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": request.name, "namespace": request.namespace},
                "data": {"from": "hub"},
            }
            try:
                try:
                    await cluster.client.create(copy)
                except mcr.AlreadyExists:
                    await cluster.client.patch(
                        CONFIGMAP, request.name, {"data": copy["data"]}, namespace=request.namespace
                    )
                copied.append(name)
            except mcr.APIError as error:
                failures.append(error)
        status = {"status": {"copies": copied}}
        await hub.client.patch(
            self.widget, request.name, status, namespace=request.namespace, subresource="status"
        )
        await self.recorder.event(
            widget, "Normal", "Copied", f"copied to {', '.join(copied) or 'no cluster'}"
        )
        if failures:
            raise failures[0]  # retried with the controller's backoff; the copies made stay


@dataclass
class Deployment:
    manager: mcr.Manager
    rbac: RBAC
    widget: mcr.Kind
    namespace: str
    admins: dict[str, mcr.Cluster]

    async def create_widget(self, name: str) -> None:
        widget = {
            "apiVersion": self.widget.api_version,
            "kind": "Widget",
            "metadata": {"name": name, "namespace": self.namespace},
        }
        await self.admins[HUB].client.create(widget)

    async def copies(self, name: str) -> list[str]:
        found = await self.admins[HUB].client.get(self.widget, name, namespace=self.namespace)
        return list((found.get("status") or {}).get("copies") or [])

    async def copied_to(self, member: str, name: str) -> bool:
        found = await self.admins[member].client.get_or_none(CONFIGMAP, name, namespace=self.namespace)
        return found is not None

    async def readyz(self) -> str:
        async with (
            aiohttp.ClientSession() as session,
            session.get(self.manager.endpoints.url("/readyz") + "?verbose") as response,
        ):
            return await response.text()

    async def grant(self, cluster: str, role: Any) -> None:
        await _grant(self.admins[cluster], self.rbac, role)


async def _grant(admin: mcr.Cluster, rbac: RBAC, role: Any, without: str | None = None) -> None:
    """Apply ``role``'s generated objects with ``admin``, less the rule naming ``without``."""
    for obj in rbac.objects(role):
        if without is not None and "rules" in obj:
            obj = {**obj, "rules": [rule for rule in obj["rules"] if without not in rule["resources"]]}
        await admin.client.apply(obj, field_manager="rbac-test", force=True)


async def _service_account_dir(plane: ControlPlane, namespace: str, account: str, directory: Path) -> None:
    """Write what the kubelet mounts: a token of the ServiceAccount (TokenRequest API) and the CA."""
    async with core_api(plane.kubeconfig()) as api:
        request = k8s.AuthenticationV1TokenRequest(
            spec=k8s.V1TokenRequestSpec(audiences=[], expiration_seconds=3600)
        )
        answer = await api.create_namespaced_service_account_token(account, namespace, request)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "token").write_text(answer.status.token)
    (directory / "token").chmod(0o600)
    shutil.copyfile(plane.directory / "ca.crt", directory / "ca.crt")


def _in_cluster(plane: ControlPlane, directory: Path, monkeypatch: pytest.MonkeyPatch) -> mcr.ClusterConfig:
    """``in_cluster_config`` as a Pod of ``plane`` would call it."""
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "127.0.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", str(plane.apiserver.port))
    return mcr.in_cluster_config(directory)


@asynccontextmanager
async def deployed(
    fleet: Fleet,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    *,
    missing: tuple[str, str, str] | None = None,
) -> AsyncIterator[Deployment]:
    """The copier running with exactly the generated RBAC (``missing``: (cluster, role, resource) left out)."""
    name = unique("rbac")
    namespace = unique("copies")
    async with contextlib.AsyncExitStack() as stack:
        admins = {
            plane: await stack.enter_async_context(
                mcr.Cluster(f"admin-{plane}", mcr.kubeconfig_from_dict(fleet[plane].kubeconfig()))
            )
            for plane in (HUB, *MEMBERS)
        }
        widget = await install_widget_crd(admins[HUB])
        for admin in admins.values():
            await admin.client.create(
                {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}
            )
        # The hub's ServiceAccount is the Deployment's own (the deploy manifests create it).
        await admins[HUB].client.create(
            {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name, "namespace": namespace}}
        )
        directories = {plane: tmp_path / "serviceaccount" / plane for plane in (HUB, *MEMBERS)}

        def build(configs: dict[str, mcr.ClusterConfig]) -> mcr.Manager:
            members = {member: configs[member] for member in MEMBERS}
            manager = mcr.Manager(
                mcr.StaticProvider(members),
                local=configs[HUB],
                handle_signals=False,
                health_probe_address="127.0.0.1:0",
                field_manager="copier",
            )
            Copier(manager, widget, namespace)
            return manager

        # As `mcruntime rbac` would: build the program, derive its RBAC, apply it.
        admin_configs = {plane: admin.config for plane, admin in admins.items()}
        rbac = mcr.rbac_for(build(admin_configs), name=name, namespace=namespace)
        for plane, role in ((HUB, "hub"), *((member, "member") for member in MEMBERS)):
            left_out = missing[2] if missing is not None and missing[:2] == (plane, role) else None
            await _grant(admins[plane], rbac, role, without=left_out)
            await _service_account_dir(fleet[plane], namespace, name, directories[plane])
        # Then run it as the Pod would, on its ServiceAccounts' tokens.
        manager = build(
            {plane: _in_cluster(fleet[plane], directories[plane], monkeypatch) for plane in directories}
        )
        deployment = Deployment(manager, rbac, widget, namespace, admins)
        async with running(manager):
            yield deployment


async def test_the_generated_rbac_is_all_the_controller_needs(
    fleet: Fleet, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with deployed(fleet, tmp_path, monkeypatch) as deployment:
        await deployment.create_widget("first")
        await wait_until(lambda: deployment.copies("first"), timeout=60)

        async def everywhere() -> bool:
            return await deployment.copies("first") == list(MEMBERS) and all(
                [await deployment.copied_to(member, "first") for member in MEMBERS]
            )

        await wait_until(everywhere, timeout=60)
        events = await deployment.admins[HUB].client.list(EVENT, namespace=deployment.namespace)
        assert [event["reason"] for event in events.items] != []
        await wait_until(lambda: _passes(deployment), timeout=60)
        statuses = deployment.manager.provider.statuses()  # type: ignore[union-attr]
        assert all(statuses[member].missing_permissions == () for member in MEMBERS)


async def _passes(deployment: Deployment) -> bool:
    return (await deployment.readyz()).endswith("readyz check passed\n")


async def test_a_member_rule_missing_is_named_for_that_member_and_recovers_when_granted(
    fleet: Fleet, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with deployed(
        fleet, tmp_path, monkeypatch, missing=("cluster-3", "member", "configmaps")
    ) as deployment:
        denied = "cannot list ConfigMap (configmaps) cluster-wide"
        await wait_until(lambda: _names(deployment, "cluster:cluster-3", denied), timeout=10)
        status = deployment.manager.provider.statuses()["cluster-3"]  # type: ignore[union-attr]
        assert denied in status.missing_permissions
        assert status.phase is mcr.ClusterPhase.UNHEALTHY and denied in (status.error or "")
        # The metrics read the same record: an alert on mcruntime_cluster_healthy == 0 fires.
        sample = deployment.manager.registry.get_sample_value
        assert sample("mcruntime_cluster_healthy", {"cluster": "cluster-3"}) == 0
        assert sample("mcruntime_cluster_healthy", {"cluster": "cluster-2"}) == 1
        assert sample("mcruntime_engaged_clusters", {"state": "unhealthy"}) == 1

        # The rest of the fleet keeps working.
        await deployment.create_widget("during")
        await wait_until(lambda: deployment.copied_to("cluster-2", "during"), timeout=60)

        await deployment.grant("cluster-3", "member")
        await wait_until(lambda: _passes(deployment), timeout=RECOVERY)
        assert deployment.manager.provider.statuses()["cluster-3"].missing_permissions == ()  # type: ignore[union-attr]
        assert sample("mcruntime_cluster_healthy", {"cluster": "cluster-3"}) == 1
        assert sample("mcruntime_engaged_clusters", {"state": "unhealthy"}) == 0
        await deployment.create_widget("after")
        await wait_until(lambda: deployment.copied_to("cluster-3", "after"), timeout=60)


async def test_a_hub_rule_missing_is_named_for_the_hub_and_recovers_when_granted(
    fleet: Fleet, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with deployed(
        fleet, tmp_path, monkeypatch, missing=("cluster-1", "hub", "widgets/status")
    ) as deployment:
        await deployment.create_widget("during")
        denied = f"cannot patch Widget (widgets/status.{deployment.widget.group}) in namespace {deployment.namespace!r}"
        await wait_until(lambda: _names(deployment, "cluster:local", denied), timeout=10)
        local = deployment.manager.local
        assert local is not None and denied in local.health.missing_permissions
        sample = deployment.manager.registry.get_sample_value
        assert sample("mcruntime_cluster_healthy", {"cluster": "local"}) == 0
        assert sample("mcruntime_engaged_clusters", {"state": "unhealthy"}) == 1

        # The rest of the fleet keeps working: the copies are made, only the status is refused.
        for member in MEMBERS:
            await wait_until(functools.partial(deployment.copied_to, member, "during"), timeout=60)

        await deployment.grant(HUB, "hub")
        await deployment.create_widget("after")
        await wait_until(lambda: _passes(deployment), timeout=RECOVERY)
        await wait_until(lambda: deployment.copies("after"), timeout=60)
        assert local.health.missing_permissions == ()
        assert sample("mcruntime_cluster_healthy", {"cluster": "local"}) == 1


async def test_a_refused_event_is_logged_once_and_shown_in_readyz_without_failing_it(
    fleet: Fleet, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # Events are best-effort: a leader whose every real write succeeds must not leave its
    # Service (and its webhooks') over them, nor log the refusal once per event.
    caplog.set_level(logging.INFO, "mcruntime.permissions")
    caplog.set_level(logging.DEBUG, "mcruntime.events")  # last: it sets the capture's level too
    async with deployed(fleet, tmp_path, monkeypatch, missing=("cluster-1", "hub", "events")) as deployment:
        for name in ("one", "two", "three"):
            await deployment.create_widget(name)

        def recorder_lines(level: int) -> list[str]:
            return [
                record.getMessage()
                for record in caplog.records
                if record.name == "mcruntime.events" and record.levelno == level
            ]

        # Every Widget's reconcile tries its event: one WARNING, the repeats at DEBUG.
        await wait_until(lambda: len(recorder_lines(logging.DEBUG)) >= 2, timeout=60)
        for name in ("one", "two", "three"):
            await wait_until(functools.partial(deployment.copies, name), timeout=60)
        warned = recorder_lines(logging.WARNING)
        assert len(warned) == 1, warned
        assert "controller 'copier': could not record event Copied" in warned[0]
        denied = f"cannot create Event (events.events.k8s.io) in namespace {deployment.namespace!r}"
        await wait_until(lambda: _passes(deployment), timeout=60)  # not counted...
        body = await deployment.readyz()
        assert f"[-]events:local failed: forbidden by RBAC: {denied}" in body  # ... but shown
        assert "[+]cluster:local ok" in body
        local = deployment.manager.local
        assert local is not None and local.health.missing_permissions == ()
        assert denied in local.health.refused_events
        assert (
            deployment.manager.registry.get_sample_value("mcruntime_cluster_healthy", {"cluster": "local"})
            == 1
        )
        refusals = [
            record.getMessage() for record in caplog.records if record.name == "mcruntime.permissions"
        ]
        assert len(refusals) == 1 and "best-effort" in refusals[0], refusals

        await deployment.grant(HUB, "hub")
        await deployment.create_widget("after")
        again = "controller 'copier': events are recorded in cluster '' again"
        await wait_until(lambda: again in caplog.text, timeout=RECOVERY)
        assert "events:local" not in await deployment.readyz()
        assert local.health.refused_events == ()
        assert len(recorder_lines(logging.WARNING)) == 1
        assert caplog.text.count(again) == 1


async def _names(deployment: Deployment, line: str, denied: str) -> bool:
    body = await deployment.readyz()
    return any(
        row.startswith(f"[-]{line} failed: forbidden by RBAC: ") and denied in row
        for row in body.splitlines()
    )
