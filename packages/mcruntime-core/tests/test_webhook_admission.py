"""Admission webhooks called by real API servers over TLS, each cluster on a path of its own."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import pytest
from kube_helpers import CONFIGMAP, configmap, unique, wait_for
from webhook_helpers import (
    config_of,
    fleet_manager,
    install_crd,
    kind_crd,
    make_test,
    new_group,
    serving,
    webhook_options,
)

import mcruntime as mcr
from mcruntime.testing import Fleet


async def _prepare(fleet: Fleet, group: str, namespace: str) -> None:
    """Each cluster: the Test CRD, a namespace, and a ConfigMap allowing only its own name as image."""
    for plane in fleet:
        await install_crd(plane, kind_crd(group))
        async with mcr.Cluster("setup", config_of(plane)) as cluster:
            await cluster.client.create(
                {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}
            )
            await cluster.client.create(configmap("allowed-images", namespace, image=plane.name))


async def _create(fleet: Fleet, cluster: str, obj: dict[str, Any]) -> dict[str, Any]:
    async with mcr.Cluster("caller", config_of(fleet[cluster])) as client_cluster:
        return await client_cluster.client.create(obj)


async def test_each_cluster_validates_and_defaults_against_its_own_cache(fleet: Fleet) -> None:
    group, namespace = new_group(), unique("admit")
    kind = mcr.Kind(f"{group}/v1", "Test")
    await _prepare(fleet, group, namespace)
    manager = fleet_manager(fleet, webhook_options())
    seen: list[tuple[str, str, str]] = []

    async def validate(req: mcr.AdmissionRequest) -> None:
        assert req.object is not None
        seen.append((req.cluster, req.operation, req.name))
        image = req.object.get("spec", {}).get("image")
        if image == "crash":
            raise RuntimeError("the validator has a bug")
        if not image:
            raise mcr.Denied("spec.image is required", code=422, reason="Invalid")
        # Read through "the client": inside a webhook it is routed to the calling cluster's cache.
        allowed = await manager.client.get_or_none(CONFIGMAP, "allowed-images", namespace=req.namespace)
        if allowed is None or allowed["data"]["image"] != image:
            raise mcr.Denied(f"image {image!r} is not allowed in cluster {req.cluster!r}")
        if req.object["spec"].get("replicas") == 1:
            req.warn("one replica is no redundancy")

    async def default(req: mcr.AdmissionRequest) -> dict[str, Any]:
        assert req.object is not None
        obj = dict(req.object)
        obj["spec"] = {"replicas": 1, **obj.get("spec", {})}
        obj["metadata"] = {**obj["metadata"], "labels": {"defaulted-in": req.cluster}}
        return obj

    mcr.webhook_managed_by(manager).for_(kind).with_validator(validate).with_defaulter(default).complete()
    names = [plane.name for plane in fleet]
    async with serving(manager, names):
        for name in names:
            created = await _create(fleet, name, make_test(kind, "good", namespace, image=name))
            assert created["spec"] == {"image": name, "replicas": 1}
            assert created["metadata"]["labels"] == {"defaulted-in": name}
            other = names[(names.index(name) + 1) % len(names)]
            with pytest.raises(mcr.Forbidden, match=f"image '{other}' is not allowed in cluster '{name}'"):
                await _create(fleet, name, make_test(kind, "foreign", namespace, image=other))
            with pytest.raises(mcr.Invalid, match=r"spec\.image is required"):
                await _create(fleet, name, make_test(kind, "empty", namespace))
            with pytest.raises(mcr.APIError, match="the validator failed: RuntimeError"):
                await _create(fleet, name, make_test(kind, "crash", namespace, image="crash"))
        assert {(cluster, op, obj) for cluster, op, obj in seen if obj == "good"} == {
            (name, "CREATE", "good") for name in names
        }


async def test_a_hung_handler_in_one_cluster_leaves_the_others_their_capacity(fleet: Fleet) -> None:
    group, namespace = new_group(), unique("hung")
    kind = mcr.Kind(f"{group}/v1", "Test")
    await _prepare(fleet, group, namespace)
    names = [plane.name for plane in fleet]
    hung, healthy = names[0], names[1:]
    lane_width = 2
    manager = fleet_manager(
        fleet, webhook_options(max_concurrent_per_cluster=lane_width, handler_timeout=28.0)
    )
    entered = asyncio.Semaphore(0)
    release = asyncio.Event()
    served: list[str] = []

    async def validate(req: mcr.AdmissionRequest) -> None:
        if req.cluster == hung:
            entered.release()
            await release.wait()
        served.append(req.cluster)

    mcr.webhook_managed_by(manager).for_(kind).with_validator(validate).with_options(
        timeout_seconds=30
    ).complete()
    async with serving(manager, names):
        # Fill the hung cluster's whole lane.
        blocked = [
            asyncio.create_task(_create(fleet, hung, make_test(kind, f"blocked-{i}", namespace, image="x")))
            for i in range(lane_width)
        ]
        try:
            for _ in range(lane_width):
                await entered.acquire()
            # Its lane is full and stays full; every other cluster is admitted meanwhile.
            for name in healthy:
                for i in range(5):
                    await _create(fleet, name, make_test(kind, f"ok-{i}", namespace, image="x"))
            assert served.count(hung) == 0 and not any(task.done() for task in blocked)
            assert sorted(set(served)) == sorted(healthy) and len(served) == 5 * len(healthy)
        finally:
            release.set()
            results = await asyncio.gather(*blocked, return_exceptions=True)
        assert all(isinstance(result, dict) for result in results), results


async def test_a_call_past_the_handler_timeout_is_answered_and_the_others_are_not_held(fleet: Fleet) -> None:
    group, namespace = new_group(), unique("timeout")
    kind = mcr.Kind(f"{group}/v1", "Test")
    await _prepare(fleet, group, namespace)
    names = [plane.name for plane in fleet]
    hung = names[0]
    manager = fleet_manager(fleet, webhook_options(max_concurrent_per_cluster=1, handler_timeout=1.0))
    never = asyncio.Event()

    async def validate(req: mcr.AdmissionRequest) -> None:
        if req.cluster == hung:
            await never.wait()

    mcr.webhook_managed_by(manager).for_(kind).with_validator(validate).complete()
    async with serving(manager, names):
        blocked = asyncio.create_task(_create(fleet, hung, make_test(kind, "stuck", namespace, image="x")))
        for name in names[1:]:
            await _create(fleet, name, make_test(kind, "fine", namespace, image="x"))
        with pytest.raises(mcr.APIError, match=r"the validator did not answer within 1\.0s"):
            await blocked


async def test_a_hung_handler_is_answered_before_the_api_servers_own_deadline(fleet: Fleet) -> None:
    """timeoutSeconds below handler_timeout: the server answers by the API server's ?timeout=, per on_error."""
    group, namespace = new_group(), unique("deadline")
    kind = mcr.Kind(f"{group}/v1", "Test")
    await _prepare(fleet, group, namespace)
    plane = fleet["cluster-1"]
    manager = fleet_manager(fleet, webhook_options())  # handler_timeout: 10 s, the default
    never = asyncio.Event()

    async def validate(_req: mcr.AdmissionRequest) -> None:
        await never.wait()

    mcr.webhook_managed_by(manager).for_(kind).with_validator(validate).with_options(
        timeout_seconds=2
    ).complete()
    async with serving(manager, [plane.name]):
        with pytest.raises(mcr.APIError, match=r"the validator did not answer within 1\.8s"):
            await _create(fleet, plane.name, make_test(kind, "hung", namespace, image="x"))


async def test_a_handler_error_can_be_left_to_the_failure_policy(fleet: Fleet) -> None:
    group, namespace = new_group(), unique("policy")
    kind = mcr.Kind(f"{group}/v1", "Test")
    plane = fleet["cluster-1"]
    await install_crd(plane, kind_crd(group))
    async with mcr.Cluster("setup", config_of(plane)) as cluster:
        await cluster.client.create(
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}
        )
    manager = mcr.Manager(
        mcr.StaticProvider({plane.name: config_of(plane)}), handle_signals=False, webhook=webhook_options()
    )

    async def broken(_req: mcr.AdmissionRequest) -> None:
        raise RuntimeError("broken")

    # on_error="error" answers HTTP 500, and failurePolicy Ignore then admits the object.
    mcr.webhook_managed_by(manager).for_(kind).with_validator(broken).with_options(
        on_error="error", failure_policy="Ignore"
    ).complete()
    async with serving(manager, [plane.name]):
        created = await _create(fleet, plane.name, make_test(kind, "admitted", namespace, image="x"))
        assert created["metadata"]["name"] == "admitted"


async def test_configurations_are_removed_on_disengage_only_when_asked(fleet: Fleet) -> None:
    plane = fleet["cluster-2"]
    group = new_group()
    kind = mcr.Kind(f"{group}/v1", "Test")
    await install_crd(plane, kind_crd(group))
    validating = mcr.Kind("admissionregistration.k8s.io/v1", "ValidatingWebhookConfiguration")

    async def allow(_req: mcr.AdmissionRequest) -> None:
        return None

    names = []
    for remove in (True, False):
        options = webhook_options(remove_on_disengage=remove)
        names.append(options.configuration_name)
        manager = mcr.Manager(
            mcr.StaticProvider({plane.name: config_of(plane)}), handle_signals=False, webhook=options
        )
        mcr.webhook_managed_by(manager).for_(kind).with_validator(allow).complete()
        async with serving(manager, [plane.name]):
            pass
    async with mcr.Cluster("check", config_of(plane)) as cluster:
        assert await cluster.client.get_or_none(validating, names[0]) is None
        kept = await cluster.client.get(validating, names[1])
        assert kept["webhooks"][0]["clientConfig"]["url"].endswith(
            f"/clusters/{plane.name}/validate/{group}/v1/Test"
        )
        assert kept["webhooks"][0]["clientConfig"]["caBundle"]
        with contextlib.suppress(mcr.NotFound):
            await cluster.client.delete(validating, names[1])


async def test_webhooks_registered_after_start_reach_every_cluster(fleet: Fleet) -> None:
    group = new_group()
    kind = mcr.Kind(f"{group}/v1", "Test")
    for plane in fleet:
        await install_crd(plane, kind_crd(group))
    manager = fleet_manager(fleet, webhook_options())
    names = [plane.name for plane in fleet]

    async def deny(req: mcr.AdmissionRequest) -> None:
        raise mcr.Denied(f"late webhook in {req.cluster}")

    from kube_helpers import running

    async with running(manager):
        await wait_for(lambda: set(names) <= set(manager.clusters()))
        mcr.webhook_managed_by(manager).for_(kind).with_validator(deny).complete()
        await wait_for(lambda: all(manager.webhook.registrar.applied.get(name, 0) >= 1 for name in names))
        for name in names:
            with pytest.raises(mcr.Forbidden, match=f"late webhook in {name}"):
                await _create(fleet, name, make_test(kind, "late", "default", image="x"))


async def test_registration_waits_for_a_crd_installed_later_and_shows_why_meanwhile(
    fleet: Fleet, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="mcruntime.webhook")
    group = new_group()
    kind = mcr.Kind(f"{group}/v1", "Test")
    plane = fleet["cluster-3"]
    manager = mcr.Manager(
        mcr.StaticProvider({plane.name: config_of(plane)}), handle_signals=False, webhook=webhook_options()
    )
    manager.webhook.registrar.backoff = mcr.Backoff(base=0.05, cap=0.5)

    async def deny(req: mcr.AdmissionRequest) -> None:
        raise mcr.Denied(f"registered late in {req.cluster}")

    mcr.webhook_managed_by(manager).for_(kind).with_validator(deny).complete()
    from kube_helpers import running

    async with running(manager):
        registrar = manager.webhook.registrar
        await wait_for(lambda: plane.name in registrar.failing)
        assert f"serves no Test in {group}/v1" in registrar.failing[plane.name]

        def failures(level: int) -> int:
            return sum(
                1 for r in caplog.records if r.levelno == level and "registration failed" in r.getMessage()
            )

        await wait_for(lambda: failures(logging.DEBUG) >= 3, what="a few more attempts")
        assert failures(logging.WARNING) == 1  # said once; /readyz keeps saying it
        lines = await manager.webhook.readiness()
        assert (f"webhook:registration:{plane.name}", registrar.failing[plane.name], False) in lines
        await install_crd(plane, kind_crd(group))
        await wait_for(lambda: registrar.applied.get(plane.name, 0) >= 1)
        assert plane.name not in registrar.failing
        assert any("registration succeeded after" in r.getMessage() for r in caplog.records)
        with pytest.raises(mcr.Forbidden, match=f"registered late in {plane.name}"):
            await _create(fleet, plane.name, make_test(kind, "late", "default", image="x"))
