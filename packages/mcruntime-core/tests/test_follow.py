"""follow_informers and wait_for_kind: the loops every watch-based provider runs, on a real hub."""

from __future__ import annotations

import asyncio
import contextlib

import pytest
from kube_helpers import CONFIGMAP, unique, widget_crd

import mcruntime as mcr
import mcruntime.provider as mcrp
from mcruntime.cache import Informer
from mcruntime.testing import Fleet, admin_config, wait_until

CRD = mcr.Kind("apiextensions.k8s.io/v1", "CustomResourceDefinition")
NO_WAIT = mcr.Backoff(base=0.0, cap=0.0)


class Nobody:
    """An aware that is handed nothing here: the desired set stays empty."""

    async def engage(self, name: str, cluster: mcr.Cluster) -> None:
        raise AssertionError(f"nothing should be engaged, got {name!r}")


async def test_a_pass_that_fails_five_thousand_times_is_retried_until_it_works(fleet: Fleet) -> None:
    failing = 5000
    calls = 0
    applied = asyncio.Event()

    def desired() -> dict[str, mcr.ClusterConfig]:
        nonlocal calls
        calls += 1
        if calls <= failing:
            raise RuntimeError(f"pass {calls} broke")
        return {}

    async with mcr.Cluster("hub", admin_config(fleet["cluster-1"])) as hub:
        informer = Informer(hub.client, CONFIGMAP, namespace=unique("follow"))
        clusters = mcrp.ClusterSet(owner="follow test")
        following = asyncio.create_task(
            mcrp.follow_informers(
                clusters,
                Nobody(),
                [informer],
                desired,
                owner="follow test",
                applied=applied.set,
                backoff=NO_WAIT,
            )
        )
        try:
            async with asyncio.timeout(30):
                await applied.wait()
        finally:
            following.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await following
    # Every failure was retried (none overflowed the backoff or ended the loop), then it applied.
    assert calls == failing + 1


async def test_wait_for_kind_reports_the_wait_and_returns_once_the_crd_is_installed(fleet: Fleet) -> None:
    group = f"{unique('wait')}.example.com"
    kinds = [mcr.Kind(f"{group}/v2", "Widget"), mcr.Kind(f"{group}/v1", "Widget")]
    reports: list[str | None] = []
    async with mcr.Cluster("hub", admin_config(fleet["cluster-1"])) as hub:
        waiting = asyncio.create_task(
            mcrp.wait_for_kind(
                hub,
                kinds,
                owner="wait test",
                what="Widgets",
                report=reports.append,
                backoff=mcr.Backoff(base=0.05, cap=0.2),
            )
        )
        try:
            await wait_until(lambda: len(reports) >= 2, what="the wait reported twice")
            assert not waiting.done()
            assert reports[0] is not None and reports[0].startswith("Widgets not installed")
            assert f"Widget ({group}/v2)" in reports[0]
            await hub.client.create(widget_crd(group))
            async with asyncio.timeout(30):
                found = await waiting
        finally:
            waiting.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await waiting
            with contextlib.suppress(mcr.NotFound):
                await hub.client.delete(CRD, f"widgets.{group}")
    assert found == kinds[1]  # the first candidate served, here the only one
    assert reports[-1] is None


class WidgetsNotInstalled(mcrp.KindNotInstalled):
    """A provider's own error, as each provider that watches a hub has one."""


async def test_wait_for_kind_told_not_to_wait_raises_the_providers_error_at_once(fleet: Fleet) -> None:
    group = f"{unique('nowait')}.example.com"
    kinds = [mcr.Kind(f"{group}/v1", "Widget")]
    async with mcr.Cluster("hub", admin_config(fleet["cluster-1"])) as hub:
        with pytest.raises(WidgetsNotInstalled, match=r"Widgets not installed: the hub \S+ serves no Widget"):
            await mcrp.wait_for_kind(
                hub,
                kinds,
                owner="no wait test",
                what="Widgets",
                wait=False,
                not_installed=WidgetsNotInstalled,
            )
        with pytest.raises(mcrp.KindNotInstalled):  # the kit's base, for whoever catches any provider's
            await mcrp.wait_for_kind(hub, kinds, owner="no wait test", what="Widgets", wait=False)
        # Served: the first candidate the hub serves, with no wait at all.
        found = await mcrp.wait_for_kind(hub, [*kinds, CONFIGMAP], owner="no wait test", what="x", wait=False)
    assert found == CONFIGMAP
