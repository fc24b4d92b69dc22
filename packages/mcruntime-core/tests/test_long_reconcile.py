"""A reconcile that runs on and on is logged once, naming the request and the lane it holds.

Before, a reconcile awaiting something that never came held its cluster's
lane with nothing said but a growing gauge.
"""

from __future__ import annotations

import asyncio
import logging

import pytest
from kube_helpers import CONFIGMAP, configmap, new_namespace, running_cluster

import mcruntime as mcr
from mcruntime.testing import Fleet, admin_config, running, wait_until


def _said(caplog: pytest.LogCaptureFixture, level: int, text: str) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.levelno == level and r.name == "mcruntime.controller" and text in r.getMessage()
    ]


async def test_a_reconcile_that_does_not_end_is_named_once_and_its_end_too(
    fleet: Fleet, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="mcruntime.controller")
    plane = fleet["cluster-2"]
    release = asyncio.Event()
    async with running_cluster(plane) as admin:
        namespace = await new_namespace(admin, "long")
        manager = mcr.Manager(mcr.StaticProvider({"member": admin_config(plane)}), handle_signals=False)

        async def reconcile(request: mcr.Request) -> None:
            if request.name == "stuck":
                await release.wait()  # a call without a timeout

        controller = (
            mcr.controller_managed_by(manager).for_(CONFIGMAP, namespace=namespace).complete(reconcile)
        )
        controller.long_reconcile_after = 0.5
        async with running(manager):
            await admin.client.create(configmap("stuck", namespace, v="1"))
            await wait_until(
                lambda: _said(caplog, logging.WARNING, "has run for"), what="the long reconcile named"
            )
            (warning,) = _said(caplog, logging.WARNING, "has run for")
            assert f"member:{namespace}/stuck" in warning, warning
            assert "one of cluster 'member''s 1 lane(s)" in warning, warning
            # Said once, however long it goes on: wait for a few more looks of the watch.
            looks = controller.queue.processing()[0][2]
            await wait_until(lambda: controller.queue.processing()[0][2] > looks + 0.5, what="more looks")
            assert len(_said(caplog, logging.WARNING, "has run for")) == 1
            release.set()
            await wait_until(lambda: _said(caplog, logging.INFO, "has ended"), what="its end said")
            assert f"member:{namespace}/stuck" in _said(caplog, logging.INFO, "has ended")[0]
