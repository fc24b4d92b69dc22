"""An informer whose kind stops being served says so, once, and says when it works again."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from types import SimpleNamespace
from typing import Any, cast

import aiohttp
import pytest
from kube_helpers import create_again, hung, install_widget_crd, new_namespace, running_cluster, widget_crd

import mcruntime as mcr
from mcruntime._manager.metrics import _LiveCollector
from mcruntime.cache import Informer
from mcruntime.client import HealthState
from mcruntime.testing import ControlPlane, Fleet, admin_config, running, wait_until

CRD = mcr.Kind("apiextensions.k8s.io/v1", "CustomResourceDefinition")


def _failing_gauge(cluster: mcr.Cluster) -> dict[str, float]:
    collector = _LiveCollector(list, lambda: {"w": cluster}, dict)
    return {
        sample.labels["kind"]: sample.value
        for family in collector.collect()
        if family.name == "mcruntime_informer_failing"
        for sample in family.samples
    }


def _failing(informer: Informer) -> Exception | None:
    """``informer.failing``, read anew (mypy would keep what an earlier assert narrowed it to)."""
    return informer.failing


def _scripted_informer() -> Informer:
    """An informer whose failures are fed by hand: only its cluster's name and health are read."""
    health = SimpleNamespace(state=HealthState.HEALTHY)
    client = SimpleNamespace(cluster="w", transport=SimpleNamespace(health=health))
    return Informer(cast("Any", client), mcr.Kind("example.com/v1", "Widget"), namespaces=["a", "b"])


def test_a_blip_is_not_failing_and_one_namespace_does_not_clear_another(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="mcruntime.informer")
    informer = _scripted_informer()
    boom = mcr.ServerError("etcd is away", cluster="w", status=500)
    informer._failed("a", boom, 1)
    informer._failed("a", boom, 2)
    assert _failing(informer) is None  # two in a row: a blip, not yet a stale store
    informer._failed("a", boom, 3)
    assert _failing(informer) is boom
    informer._working("b")  # another namespace's events say nothing about this one
    assert _failing(informer) is boom
    informer._failed("a", boom, 4)  # already warned of: not repeated above DEBUG
    assert [r.levelname for r in caplog.records] == ["INFO", "INFO", "WARNING"]
    informer._working("a")
    assert _failing(informer) is None
    assert "work again" in caplog.records[-1].getMessage()
    gone = mcr.NotFound("404 page not found", cluster="w", status=404)
    informer._failed("b", gone, 1)  # a kind no longer served is not a blip
    assert _failing(informer) is gone


async def test_a_kind_deleted_from_the_server_is_named_until_it_is_served_again(
    fleet: Fleet, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="mcruntime.informer")
    async with running_cluster(fleet["cluster-1"]) as cluster:
        kind = await install_widget_crd(cluster)
        group = kind.api_version.split("/")[0]
        namespace = await new_namespace(cluster)
        informer = Informer(
            cluster.client, kind, namespace=namespace, backoff=mcr.Backoff(base=0.05, cap=0.2)
        )
        running = asyncio.create_task(informer.run())
        try:
            assert await informer.wait_for_sync(30)
            assert _failing(informer) is None
            await cluster.client.delete(CRD, f"widgets.{group}")
            await wait_until(lambda: _failing(informer) is not None, what="the informer failing")
            failed_at = informer.stats.watch_restarts
            await wait_until(
                lambda: informer.stats.watch_restarts >= failed_at + 4, what="a few more failed attempts"
            )
            warnings = [
                r.getMessage()
                for r in caplog.records
                if r.levelno == logging.WARNING and r.name == "mcruntime.informer"
            ]
            # One warning for the whole outage, naming the informer's kind and what the server said.
            assert len(warnings) == 1, warnings
            assert "Widget" in warnings[0] and "cluster-1" in warnings[0] and "fails" in warnings[0], (
                warnings[0]
            )
            assert isinstance(_failing(informer), mcr.NotFound | mcr.KindNotFound), informer.failing

            await create_again(cluster, widget_crd(group))  # the kind is served again
            widget = {"apiVersion": kind.api_version, "kind": "Widget", "metadata": {"name": "back"}}

            async def written() -> bool:
                with contextlib.suppress(mcr.KindNotFound, mcr.NotFound):
                    await cluster.client.create(widget, namespace=namespace)
                    return True
                await cluster.client.discovery.refresh()
                return False

            await wait_until(written, what="a Widget written once the kind is served")
            await wait_until(lambda: f"{namespace}/back" in informer.store.objects, what="the Widget heard")
            assert _failing(informer) is None
            assert any("work again" in r.getMessage() for r in caplog.records if r.levelno == logging.INFO)
        finally:
            running.cancel()
            await asyncio.gather(running, return_exceptions=True)


async def test_a_quiet_cluster_answering_again_is_working_again_once_its_watch_is_accepted(
    fresh_cluster: ControlPlane, caplog: pytest.LogCaptureFixture
) -> None:
    # A quiet cluster sends no event until the API server's first bookmark, about a minute
    # after a watch opens: waiting for an event kept /readyz failing that long after it was back.
    caplog.set_level(logging.DEBUG, logger="mcruntime.informer")
    async with running_cluster(fresh_cluster) as cluster:
        namespace = await new_namespace(cluster)
        informer = Informer(
            cluster.client,
            mcr.Kind("v1", "ConfigMap"),
            namespace=namespace,
            read_timeout=1.0,
            backoff=mcr.Backoff(base=0.05, cap=0.2),
        )
        running = asyncio.create_task(informer.run())
        try:
            assert await informer.wait_for_sync(30)
            with hung(fresh_cluster):
                await wait_until(lambda: _failing(informer) is not None, what="the informer failing")
                events = informer.stats.events
            await wait_until(
                lambda: _failing(informer) is None, timeout=30, what="the informer working again"
            )
            assert informer.stats.events == events, "an event cleared it, not the watch's acceptance"
            # The hang was named by the cluster's health: its retries were not repeated at INFO.
            retries = [r for r in caplog.records if "retrying with backoff" in r.getMessage()]
            assert retries and all(r.levelno == logging.DEBUG for r in retries), [
                (r.levelname, r.getMessage()) for r in retries
            ]
        finally:
            running.cancel()
            await asyncio.gather(running, return_exceptions=True)


async def test_the_failing_gauge_follows_a_cache_informer(fleet: Fleet) -> None:
    async with running_cluster(fleet["cluster-2"]) as cluster:
        kind = await install_widget_crd(cluster)
        namespace = await new_namespace(cluster)
        await cluster.cache.list(kind, namespace=namespace)  # starts, and syncs, the cache's informer
        assert _failing_gauge(cluster) == {str(kind): 0.0}
        await cluster.client.delete(CRD, f"widgets.{kind.api_version.split('/')[0]}")
        await wait_until(lambda: _failing_gauge(cluster) == {str(kind): 1.0}, what="the gauge at 1")


async def _readyz_line(manager: mcr.Manager, name: str) -> str:
    url = manager.endpoints.url("/readyz") + "?verbose"
    async with aiohttp.ClientSession() as session, session.get(url) as response:
        body = await response.text()
    return next((line for line in body.splitlines() if line[3:].startswith(f"cluster:{name} ")), "")


def _healthy(manager: mcr.Manager, name: str) -> float | None:
    return manager.metrics.registry.get_sample_value("mcruntime_cluster_healthy", {"cluster": name})


async def _nothing(_request: mcr.Request) -> None:
    return None


async def test_a_member_whose_watched_kind_is_deleted_fails_its_readyz_line_until_it_is_back(
    fleet: Fleet,
) -> None:
    plane = fleet["cluster-3"]
    async with running_cluster(plane) as admin:
        kind = await install_widget_crd(admin)
        group = kind.api_version.split("/")[0]
        options = mcr.ClusterOptions(backoff=mcr.Backoff(base=0.05, cap=0.5))
        provider = mcr.StaticProvider({"member": admin_config(plane)}, options=options)
        manager = mcr.Manager(provider, health_probe_address="127.0.0.1:0", handle_signals=False)
        mcr.controller_managed_by(manager).for_(kind).complete(_nothing)

        async def line_starts(prefix: str) -> bool:
            return (await _readyz_line(manager, "member")).startswith(prefix)

        async with running(manager):
            await wait_until(lambda: line_starts("[+]"), what="the member ready")
            await admin.client.delete(CRD, f"widgets.{group}")
            await wait_until(lambda: line_starts("[-]"), what="the member's line failing")
            line = await _readyz_line(manager, "member")
            assert f"cache failing: Widget ({kind.api_version}): " in line, line
            # One verdict read three ways: statuses() and the metric agree with the line.
            status = provider.statuses()["member"]
            assert status.phase is mcr.ClusterPhase.UNHEALTHY, status
            assert (status.error or "").startswith(f"cache failing: Widget ({kind.api_version}): "), status
            assert _healthy(manager, "member") == 0.0

            await create_again(admin, widget_crd(group))
            await wait_until(lambda: line_starts("[+]"), what="the member ready again")
            assert provider.statuses()["member"].phase is mcr.ClusterPhase.READY
            assert _healthy(manager, "member") == 1.0
