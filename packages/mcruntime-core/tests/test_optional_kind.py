"""A kind some members lack by design: ``for_(kind, optional=True)`` keeps them ready.

A fleet differs on purpose (a CRD installed on some members only). Without a
way to say so, each member without the CRD failed its ``/readyz`` line for as
long as it lacked it, and a pod that is never Ready stalls its rollout. The
only lever, ``ready_min_share``, hides real outages too. A controller that
needs the kind still sees its absence as a failure, on the same informer.
"""

from __future__ import annotations

import logging

import aiohttp
import pytest
from kube_helpers import install_widget_crd, new_namespace, running_cluster, unique

import mcruntime as mcr
from mcruntime.testing import Fleet, admin_config, running, wait_until


async def _readyz(manager: mcr.Manager) -> tuple[int, list[str]]:
    url = manager.endpoints.url("/readyz") + "?verbose"
    async with aiohttp.ClientSession() as session, session.get(url) as response:
        return response.status, (await response.text()).splitlines()


def _widget(kind: mcr.Kind, name: str, namespace: str) -> dict[str, object]:
    return {
        "apiVersion": kind.api_version,
        "kind": kind.kind,
        "metadata": {"name": name, "namespace": namespace},
    }


async def test_a_member_without_an_optional_kind_is_ready_and_is_watched_once_it_is_installed(
    fleet: Fleet, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="mcruntime.informer")
    with_crd, without = fleet["cluster-1"], fleet["cluster-2"]
    group = f"{unique('g')}.test.mcruntime.dev"
    async with running_cluster(with_crd) as admin_a, running_cluster(without) as admin_b:
        kind = await install_widget_crd(admin_a, group)
        namespace_a, namespace_b = await new_namespace(admin_a), await new_namespace(admin_b)
        options = mcr.ClusterOptions(backoff=mcr.Backoff(base=0.05, cap=0.5))
        provider = mcr.StaticProvider(
            {"a": admin_config(with_crd), "b": admin_config(without)}, options=options
        )
        manager = mcr.Manager(provider, health_probe_address="127.0.0.1:0", handle_signals=False)
        seen: set[tuple[str, str]] = set()

        async def reconcile(request: mcr.Request) -> None:
            seen.add((request.cluster, request.name))

        controller = (
            mcr.controller_managed_by(manager).named("some").for_(kind, optional=True).complete(reconcile)
        )
        async with running(manager):
            await admin_a.client.create(_widget(kind, "on-a", namespace_a))
            await wait_until(lambda: ("a", "on-a") in seen, what="a's widget reconciled")
            await wait_until(lambda: controller.synced("a") and controller.synced("b"), what="synced on both")
            status, lines = await _readyz(manager)
            assert status == 200, lines
            assert provider.statuses()["b"].phase is mcr.ClusterPhase.READY
            assert (
                manager.metrics.registry.get_sample_value("mcruntime_cluster_healthy", {"cluster": "b"})
                == 1.0
            )
            gauge = {"cluster": "b", "kind": str(kind)}
            assert manager.metrics.registry.get_sample_value("mcruntime_informer_failing", gauge) == 0.0

            await install_widget_crd(admin_b, group)  # the member gets the CRD later
            await admin_b.client.create(_widget(kind, "on-b", namespace_b))
            await wait_until(lambda: ("b", "on-b") in seen, what="b's widget reconciled once installed")
    informer_lines = [
        r for r in caplog.records if r.name == "mcruntime.informer" and "serves no Widget" in r.getMessage()
    ]
    assert informer_lines and all(r.levelno == logging.INFO for r in informer_lines)


async def test_a_controller_that_needs_the_kind_still_fails_where_it_is_missing(fleet: Fleet) -> None:
    plane = fleet["cluster-3"]
    group = f"{unique('g')}.test.mcruntime.dev"
    kind = mcr.Kind(f"{group}/v1", "Widget")  # installed nowhere
    options = mcr.ClusterOptions(backoff=mcr.Backoff(base=0.05, cap=0.5))
    provider = mcr.StaticProvider({"m": admin_config(plane)}, options=options)
    manager = mcr.Manager(provider, health_probe_address="127.0.0.1:0", handle_signals=False)

    async def nothing(_request: mcr.Request) -> None:
        return None

    optional = (
        mcr.controller_managed_by(manager).named("optional").for_(kind, optional=True).complete(nothing)
    )
    mcr.controller_managed_by(manager).named("needs").for_(kind).complete(nothing)
    async with running(manager):

        async def line_failing() -> bool:
            _status, lines = await _readyz(manager)
            return any(line.startswith("[-]cluster:m ") and "cache failing" in line for line in lines)

        await wait_until(line_failing, what="m's line failing for the controller that needs the kind")
        assert optional.synced("m") and not manager.controllers["needs"].synced("m")
        status = provider.statuses()["m"]
        assert status.phase is mcr.ClusterPhase.UNHEALTHY and "serves no Widget" in (status.error or "")


async def test_a_namespace_view_honours_an_optional_kind_on_its_hosts_shared_informer(fleet: Fleet) -> None:
    # A view's informer wraps the host's: the source's "may be missing" must reach the one
    # that runs, or the view's cluster would fail for a kind its controller can live without.
    plane = fleet["cluster-3"]
    kind = mcr.Kind(f"{unique('g')}.test.mcruntime.dev/v1", "Widget")  # installed nowhere
    options = mcr.ClusterOptions(backoff=mcr.Backoff(base=0.05, cap=0.5))
    async with mcr.Cluster("host", admin_config(plane), options) as host:
        namespace = await new_namespace(host)
        async with mcr.NamespacedCluster(host, namespace) as tenant:
            source = mcr.KindSource(kind, optional=True)
            attachment = source.attach(tenant.name, tenant, lambda _event: None)
            assert await attachment.settle(30)  # settled by the absence, not a timeout
            assert isinstance(attachment.informer.failing, mcr.KindNotFound)
            assert tenant.trouble() is None
            attachment.detach()  # nobody says "may be missing" any more: the absence counts
            assert (tenant.trouble() or "").startswith("cache failing: Widget")
