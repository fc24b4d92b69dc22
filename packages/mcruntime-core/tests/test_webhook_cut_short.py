"""Calls the server cannot serve are answered in words the client sees, never dropped.

Called by real API servers: a call still running when the manager stops, over
HTTP/2 and over HTTP/1.1, and a call for a cluster the manager no longer serves.
A dropped call reached the client as "server sent GOAWAY and closed the
connection" (or, under ``failurePolicy: Ignore``, admitted the object
unchecked); a 404 as "the server could not find the requested resource".
"""

from __future__ import annotations

import asyncio
import logging

import pytest
from kube_helpers import unique, wait_for
from webhook_helpers import (
    config_of,
    install_crd,
    kind_crd,
    make_test,
    new_group,
    registered,
    serving,
    webhook_options,
)

import mcruntime as mcr
from mcruntime.testing import ControlPlane, Fleet, wait_until

CONFIGMAP = mcr.Kind("v1", "ConfigMap")
NAMESPACE = mcr.Kind("v1", "Namespace")


async def _create(plane: ControlPlane, obj: dict[str, object]) -> dict[str, object]:
    async with mcr.Cluster("caller", config_of(plane)) as cluster:
        return await cluster.client.create(obj)


@pytest.mark.parametrize("http2", [True, False], ids=["http2", "http1"])
async def test_a_call_in_flight_at_shutdown_is_answered_per_on_error(
    fleet: Fleet, http2: bool, caplog: pytest.LogCaptureFixture
) -> None:
    plane = fleet["cluster-1"]
    group = new_group()
    await install_crd(plane, kind_crd(group))
    kind = mcr.Kind(f"{group}/v1", "Test")
    manager = mcr.Manager(
        mcr.StaticProvider({plane.name: config_of(plane)}),
        handle_signals=False,
        webhook=webhook_options(http2=http2),
        graceful_shutdown_timeout=1.0,  # the call gets what is left of it: a second, then it is cut
    )
    entered = asyncio.Event()

    async def hangs(_req: mcr.AdmissionRequest) -> None:
        entered.set()
        await asyncio.Event().wait()

    mcr.webhook_managed_by(manager).for_(kind).with_validator(hangs).with_options(
        timeout_seconds=20
    ).complete()
    async with serving(manager, [plane.name]):
        creating = asyncio.create_task(_create(plane, make_test(kind, "cut", "default", image="x")))
        await asyncio.wait_for(entered.wait(), timeout=20)
        manager.stop()  # SIGTERM's doing
        with pytest.raises(mcr.APIError) as raised:
            await creating
    message = str(raised.value)
    assert "the validator was cut short: the webhook server is shutting down" in message, message
    assert "GOAWAY" not in message
    cut = [r for r in caplog.records if r.name == "mcruntime.webhook" and "cut short" in r.getMessage()]
    assert len(cut) == 1 and "default/cut" in cut[0].getMessage(), [r.getMessage() for r in cut]
    assert manager.webhook_calls_cut == 1


async def test_calls_at_shutdown_are_served_with_their_cluster_engaged_until_the_server_closes(
    fleet: Fleet, caplog: pytest.LogCaptureFixture
) -> None:
    # Found by a review: the clusters stopped before the webhook server closed, so a call in
    # flight that read its cluster through mgr.client (as the guide's validator does) was denied
    # with ClusterNotFound, and a call arriving during the drain was told its cluster "is not
    # engaged". The server now serves through the drain and closes before the clusters stop.
    plane = fleet["cluster-1"]
    group = new_group()
    await install_crd(plane, kind_crd(group))
    kind = mcr.Kind(f"{group}/v1", "Test")
    namespace = unique("wh-drain")
    async with mcr.Cluster("admin", config_of(plane)) as admin:
        await admin.client.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
    manager = mcr.Manager(
        mcr.StaticProvider({plane.name: config_of(plane)}), handle_signals=False, webhook=webhook_options()
    )
    entered, held, hold = asyncio.Event(), asyncio.Event(), asyncio.Event()

    async def validate(req: mcr.AdmissionRequest) -> None:
        if req.name == "in-flight":
            entered.set()
            # Still running when the server closes: past the reconciles' drain.
            await wait_until(lambda: manager.webhook._closing, what="the webhook server closing")
        await manager.client.list(CONFIGMAP, namespace=req.namespace)  # the calling cluster's

    async def reconcile(req: mcr.Request) -> None:
        if req.name == "hold":
            held.set()
            await hold.wait()  # the drain waits for this reconcile

    mcr.webhook_managed_by(manager).for_(kind).with_validator(validate).complete()
    mcr.controller_managed_by(manager).named("drain").for_(CONFIGMAP, namespace=namespace).complete(reconcile)
    with caplog.at_level(logging.DEBUG, logger="mcruntime.webhook"):
        async with serving(manager, [plane.name]), mcr.Cluster("writer", config_of(plane)) as writer:
            held_map = {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": "hold", "namespace": namespace},
            }
            await writer.client.create(held_map)
            await asyncio.wait_for(held.wait(), timeout=30)
            in_flight = asyncio.create_task(
                writer.client.create(make_test(kind, "in-flight", namespace, image="x"))
            )
            await asyncio.wait_for(entered.wait(), timeout=30)
            manager.stop()  # SIGTERM's doing; the held reconcile keeps the drain going
            late = await writer.client.create(make_test(kind, "late", namespace, image="x"))
            assert late["metadata"]["name"] == "late"
            hold.set()
            admitted = await in_flight
            assert admitted["metadata"]["name"] == "in-flight"
    assert manager.drained is True and manager.webhook_calls_cut == 0
    said = [r.getMessage() for r in caplog.records if r.name == "mcruntime.webhook"]
    assert not [line for line in said if "not engaged" in line or "ClusterNotFound" in line], said
    async with mcr.Cluster("admin", config_of(plane)) as admin:
        await admin.client.delete(NAMESPACE, namespace)


async def test_a_call_for_a_cluster_no_longer_served_says_so_to_the_client(
    fleet: Fleet, caplog: pytest.LogCaptureFixture
) -> None:
    plane = fleet["cluster-2"]
    group = new_group()
    await install_crd(plane, kind_crd(group))
    kind = mcr.Kind(f"{group}/v1", "Test")
    provider = mcr.StaticProvider({plane.name: config_of(plane)})
    # The configuration stays when the cluster goes (as it does unless remove_on_disengage).
    manager = mcr.Manager(provider, handle_signals=False, webhook=webhook_options(remove_on_disengage=False))

    async def allow(_req: mcr.AdmissionRequest) -> None:
        return None

    mcr.webhook_managed_by(manager).for_(kind).with_validator(allow).complete()
    async with serving(manager, [plane.name]):
        await _create(plane, make_test(kind, "before", "default", image="x"))
        await provider.remove(plane.name)
        await wait_for(lambda: plane.name not in manager.clusters())
        with caplog.at_level(logging.WARNING, logger="mcruntime.webhook"):
            for name in ("after-1", "after-2"):
                with pytest.raises(mcr.APIError) as raised:
                    await _create(plane, make_test(kind, name, "default", image="x"))
                message = str(raised.value)
                assert f"cluster '{plane.name}' is not engaged with this manager" in message, message
        named = [r for r in caplog.records if r.name == "mcruntime.webhook" and "refused" in r.getMessage()]
        assert len(named) == 1, "logged once per cluster, not per call"
        # Found by a review: the name stayed "logged" for the life of the process, so the second
        # time the cluster left, its refusals left no trace at all. Engaged again, then gone again:
        # named again.
        await provider.set(plane.name, config_of(plane))
        await registered(manager, [plane.name])  # engaged again: its lane is open
        await _create(plane, make_test(kind, "back", "default", image="x"))
        await provider.remove(plane.name)
        await wait_for(lambda: plane.name not in manager.clusters())
        with caplog.at_level(logging.WARNING, logger="mcruntime.webhook"), pytest.raises(mcr.APIError):
            await _create(plane, make_test(kind, "after-3", "default", image="x"))
    named = [r for r in caplog.records if r.name == "mcruntime.webhook" and "refused" in r.getMessage()]
    assert len(named) == 2, [r.getMessage() for r in named]
    async with mcr.Cluster("cleanup", config_of(plane)) as cluster:
        for configuration in (
            mcr.Kind("admissionregistration.k8s.io/v1", "ValidatingWebhookConfiguration"),
            mcr.Kind("admissionregistration.k8s.io/v1", "MutatingWebhookConfiguration"),
        ):
            for obj in (await cluster.client.list(configuration)).items:
                if obj["metadata"]["name"].startswith(manager.webhook.options.configuration_name):
                    await cluster.client.delete(configuration, obj["metadata"]["name"])
