"""A manager on uvloop's event loop, against a real API server.

Operators often run on uvloop (kopf's runner picks it when it is installed).
uvloop's transports are not subclasses of ``asyncio.Transport``, and both our
HTTP/1.1 request pool and our HTTP/2 watch multiplexer asserted that they
were: on uvloop every connection failed with a bare ``AssertionError`` and no
request or watch ever got through. Here the whole path runs on uvloop: a
write (HTTP/1.1), an informer's list and watch (HTTP/2), and a controller
that reconciles what the watch delivers and patches it back. The webhook
server, for its part, kept no record of its open connections on uvloop, so
stopping it left the API server's connections open.
"""

from __future__ import annotations

import asyncio

import pytest
import uvloop
from kube_helpers import sockets_on, unique
from webhook_helpers import (
    config_of,
    install_crd,
    kind_crd,
    make_test,
    new_group,
    registered,
    webhook_options,
)

import mcruntime as mcr
from mcruntime.testing import Fleet, admin_config, wait_until

CONFIGMAP = mcr.Kind("v1", "ConfigMap")


async def _reconcile_on_uvloop(config: mcr.ClusterConfig, namespace: str) -> dict[str, str]:
    assert isinstance(asyncio.get_running_loop(), uvloop.Loop)
    manager = mcr.Manager(
        local=config, cluster_options=mcr.ClusterOptions(cache_namespace=namespace), handle_signals=False
    )

    async def reconcile(request: mcr.Request) -> None:
        cluster = await manager.get_cluster(request.cluster)
        found = await cluster.cache.get_or_none(CONFIGMAP, request.name, namespace=request.namespace)
        if found is None or (found.get("data") or {}).get("seen") == "yes":
            return
        await cluster.client.patch(
            CONFIGMAP, request.name, {"data": {"seen": "yes"}}, namespace=request.namespace
        )

    mcr.controller_managed_by(manager).named("on-uvloop").for_(CONFIGMAP, namespace=namespace).complete(
        reconcile
    )
    async with mcr.Cluster("uvloop-writer", config) as writer:
        await writer.client.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
        running = asyncio.create_task(manager.start())
        try:
            await writer.client.create(
                {
                    "apiVersion": "v1",
                    "kind": "ConfigMap",
                    "metadata": {"name": "probe", "namespace": namespace},
                }
            )
            await wait_until(lambda: "" in manager.clusters(), timeout=60, what="the local cluster engaged")
            local = await manager.get_cluster("")

            async def cached() -> object:
                found = await local.cache.get_or_none(CONFIGMAP, "probe", namespace=namespace)
                return found is not None and (found.get("data") or {}).get("seen") == "yes"

            # The patch went out over HTTP/1.1, and its event came back through the watch (HTTP/2).
            await wait_until(cached, timeout=60, what="the controller's own patch in its cache")
            stored = await writer.client.get(CONFIGMAP, "probe", namespace=namespace)
        finally:
            manager.stop()
            await running
    return dict(stored.get("data") or {})


def test_a_manager_lists_watches_reconciles_and_writes_on_uvloop(fleet: Fleet) -> None:
    config = admin_config(fleet["cluster-1"], trust=mcr.TrustPolicy.untrusted())
    namespace = unique("uvloop")
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        assert runner.run(_reconcile_on_uvloop(config, namespace)) == {"seen": "yes"}


async def _admit_on_uvloop(config: mcr.ClusterConfig, name: str, kind: mcr.Kind, namespace: str) -> int:
    assert isinstance(asyncio.get_running_loop(), uvloop.Loop)
    manager = mcr.Manager(mcr.StaticProvider({name: config}), handle_signals=False, webhook=webhook_options())

    async def validate(req: mcr.AdmissionRequest) -> None:
        if req.name == "refused":
            raise mcr.Denied(f"refused in cluster {req.cluster!r} on uvloop")

    mcr.webhook_managed_by(manager).for_(kind).with_validator(validate).complete()
    running = asyncio.create_task(manager.start())
    try:
        await registered(manager, [name])
        async with mcr.Cluster("uvloop-caller", config) as caller:
            await caller.client.create(
                {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}
            )
            await caller.client.create(make_test(kind, "allowed", namespace, image="x"))
            with pytest.raises(mcr.Forbidden, match=f"refused in cluster '{name}' on uvloop"):
                await caller.client.create(make_test(kind, "refused", namespace, image="x"))
        port = manager.webhook.port
        assert port is not None
        assert sockets_on(port) >= 2  # the listener, and the API server's connection kept open
    finally:
        manager.stop()
        await running
    return sockets_on(port)


def test_a_webhook_served_on_uvloop_is_called_by_the_api_server_and_closes_its_connections(
    fleet: Fleet,
) -> None:
    plane = fleet["cluster-2"]
    group = new_group()
    kind = mcr.Kind(f"{group}/v1", "Test")
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(install_crd(plane, kind_crd(group)))
        left = runner.run(_admit_on_uvloop(config_of(plane), plane.name, kind, unique("uvloop-admit")))
    assert left == 0  # stopping the server closed the API server's connection too
