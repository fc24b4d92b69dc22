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
from kube_helpers import wait_for
from webhook_helpers import config_of, install_crd, kind_crd, make_test, new_group, serving, webhook_options

import mcruntime as mcr
from mcruntime.testing import ControlPlane, Fleet


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
    async with mcr.Cluster("cleanup", config_of(plane)) as cluster:
        for configuration in (
            mcr.Kind("admissionregistration.k8s.io/v1", "ValidatingWebhookConfiguration"),
            mcr.Kind("admissionregistration.k8s.io/v1", "MutatingWebhookConfiguration"),
        ):
            for obj in (await cluster.client.list(configuration)).items:
                if obj["metadata"]["name"].startswith(manager.webhook.options.configuration_name):
                    await cluster.client.delete(configuration, obj["metadata"]["name"])
