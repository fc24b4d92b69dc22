"""Honest mistakes of a controller's author get errors that say what and where.

From an outside review writing controllers from the docs: an ``async`` map
function, one that raises, an index never registered (``mgr.index_field`` not
awaited) and a status write to a kind without a status subresource each ended
in an error that named neither the controller, the kind nor the cluster, or,
for the last, in a ``NotFound`` that a reconciler takes for "deleted".
"""

from __future__ import annotations

import logging
from typing import Any

import pytest
from kube_helpers import CONFIGMAP, configmap, new_namespace, running_cluster, unique

import mcruntime as mcr
from mcruntime.testing import Fleet, admin_config, running, wait_until

NAMESPACE = mcr.Kind("v1", "Namespace")


def test_an_async_map_function_is_refused_when_the_handler_is_made() -> None:
    async def widgets_of(_cluster: str, _obj: dict[str, Any]) -> list[mcr.Request]:
        return []

    with pytest.raises(
        TypeError, match=r"enqueue_mapped\(.*widgets_of\): a map function is a plain function"
    ):
        mcr.enqueue_mapped(widgets_of)  # type: ignore[arg-type]  # the mistake under test


async def test_a_map_function_that_raises_is_logged_naming_the_controller_and_the_event(
    fleet: Fleet, caplog: pytest.LogCaptureFixture
) -> None:
    plane = fleet["cluster-1"]
    async with running_cluster(plane, "setup") as setup:
        namespace = await new_namespace(setup, "mapped")
    manager = mcr.Manager(mcr.StaticProvider({"east": admin_config(plane)}), handle_signals=False)
    name = unique("mapped")

    def broken(_cluster: str, obj: dict[str, Any]) -> list[mcr.Request]:
        raise LookupError(f"no widget for {obj['metadata']['name']}")

    async def reconcile(_request: mcr.Request) -> None:
        return None

    mcr.controller_managed_by(manager).named(name).for_(
        mcr.Kind("v1", "Secret"), namespace=namespace
    ).watches(CONFIGMAP, mcr.enqueue_mapped(broken), namespace=namespace).complete(reconcile)
    provider = manager.provider
    assert isinstance(provider, mcr.StaticProvider)
    async with running(manager):
        cluster = await provider.clusters.wait_engaged("east")
        await cluster.client.create(configmap("cfg", namespace, v="1"))

        def logged() -> list[logging.LogRecord]:
            return [r for r in caplog.records if r.name == "mcruntime.controller" and name in r.getMessage()]

        await wait_until(logged, what="the map function's failure logged")
    record = logged()[0]
    assert record.levelno == logging.ERROR
    assert record.getMessage() == (
        f"controller {name}: enqueue_mapped('broken') failed on create of ConfigMap {namespace}/cfg in cluster 'east'"
    )
    assert record.exc_info is not None and "no widget for cfg" in str(record.exc_info[1])
    async with running_cluster(plane, "cleanup") as cleanup:
        await cleanup.client.delete(NAMESPACE, namespace)


async def test_an_index_never_registered_and_a_missing_status_subresource_are_named(fleet: Fleet) -> None:
    async with running_cluster(fleet["cluster-2"], "named") as cluster:
        namespace = await new_namespace(cluster, "named")
        created = await cluster.client.create(configmap("cfg", namespace, v="1"))
        cluster.cache.index_field(CONFIGMAP, "by-owner", lambda _obj: [])
        with pytest.raises(KeyError) as raised:
            await cluster.cache.list(CONFIGMAP, index=("forgot-await", "x"))
        assert "cluster 'named': ConfigMap.v1 has no index named 'forgot-await' (it has: 'by-owner')" in str(
            raised.value
        )
        with pytest.raises(mcr.APIError, match=r"ConfigMap \(v1\) has no 'status' subresource") as refused:
            await cluster.client.update_status(created)
        assert not isinstance(refused.value, mcr.NotFound)  # not "the object is gone"
        assert (refused.value.cluster, refused.value.reason) == ("named", "NoSuchSubresource")
        await cluster.client.delete(NAMESPACE, namespace)
