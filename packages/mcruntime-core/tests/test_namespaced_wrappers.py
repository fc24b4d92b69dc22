"""NamespacedCluster's client, cache and informer view: wrappers that leave no public path unpinned.

They are a Client, a Cache and an Informer by type, so a cluster's components
accept them; what keeps a namespace view pinned is that each defines every
public method itself and delegates through public methods. A method added to
Client, Cache or Informer later is inherited unpinned: these tests fail until
the wrapper defines it too.
"""

from __future__ import annotations

import inspect
from typing import Any

import pytest
from kube_helpers import CONFIGMAP, configmap, new_namespace, running_cluster

import mcruntime as mcr
from mcruntime._cache.informer import Informer
from mcruntime._client.client import ObjectList
from mcruntime._client.protocols import Reader, Writer
from mcruntime._fleet.namespaced_cache import NamespacedCache, NamespaceInformer
from mcruntime._fleet.namespaced_client import NamespacedClient
from mcruntime.testing import Fleet

# Members a wrapper may inherit: they describe the wrapper itself (its name, its
# configured scope), read no object and send no request.
CONFIGURATION = {"cluster", "namespace", "namespaces", "scope"}


def _public_methods(cls: type) -> set[str]:
    return {
        name
        for name, member in inspect.getmembers(cls)
        if not name.startswith("_") and (inspect.isfunction(member) or isinstance(member, property))
    }


@pytest.mark.parametrize(
    ("base", "wrapper"),
    [(mcr.Client, NamespacedClient), (mcr.Cache, NamespacedCache), (Informer, NamespaceInformer)],
    ids=["client", "cache", "informer"],
)
def test_every_public_method_is_the_wrappers_own(base: type, wrapper: type) -> None:
    inherited = sorted(_public_methods(base) - set(vars(wrapper)) - CONFIGURATION)
    assert inherited == [], f"{wrapper.__name__} inherits {inherited} from {base.__name__} unpinned"


def test_the_client_and_the_cache_are_readers_and_the_client_a_writer() -> None:
    # Checked by mypy: these assignments fail the type check if a signature drifts.
    def client_roles(client: mcr.Client) -> tuple[Reader[ObjectList], Writer]:
        return client, client

    def cache_role(cache: mcr.Cache) -> Reader[list[dict[str, Any]]]:
        return cache

    assert callable(client_roles) and callable(cache_role)


async def test_writes_without_a_namespace_land_in_the_views(fleet: Fleet) -> None:
    async with running_cluster(fleet["cluster-1"], "host") as host:
        mine = await new_namespace(host, "mine")
        async with mcr.NamespacedCluster(host, mine) as tenant:
            tenant.client.field_manager = "tenant-controller"
            manifest = {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": "a"},
                "data": {"k": "1"},
            }
            created = await tenant.client.create(manifest)
            assert "namespace" not in manifest["metadata"]  # the caller's object is left alone
            assert created["metadata"]["namespace"] == mine
            assert {entry["manager"] for entry in created["metadata"]["managedFields"]} == {
                "tenant-controller"
            }
            changed = {**created, "metadata": {**created["metadata"]}, "data": {"k": "2"}}
            del changed["metadata"]["namespace"]
            assert (await tenant.client.update(changed))["data"] == {"k": "2"}
            patched = await tenant.client.patch(CONFIGMAP, "a", {"data": {"k": "3"}})
            assert patched["metadata"]["namespace"] == mine and patched["data"] == {"k": "3"}
            await tenant.client.delete(CONFIGMAP, "a")
            assert await host.client.get_or_none(CONFIGMAP, "a", namespace=mine) is None


async def test_errors_name_the_view_not_the_host(fleet: Fleet) -> None:
    async with running_cluster(fleet["cluster-2"], "host") as host:
        mine = await new_namespace(host, "mine")
        async with mcr.NamespacedCluster(host, mine, name="tenant") as tenant:
            with pytest.raises(mcr.NotFound) as live:
                await tenant.client.get(CONFIGMAP, "absent")
            assert live.value.cluster == "tenant" and live.value.namespace == mine
            with pytest.raises(mcr.NotFound) as cached:
                await tenant.cache.get(CONFIGMAP, "absent")
            assert cached.value.cluster == "tenant"
            with pytest.raises(mcr.Forbidden, match="namespace 'elsewhere' is outside it") as refused:
                await tenant.client.update(configmap("a", "elsewhere"))
            assert refused.value.cluster == "tenant"


@pytest.mark.parametrize("shared_informers", [True, False], ids=["shared", "own"])
async def test_the_cache_reads_the_views_namespace_by_name_alone(
    fleet: Fleet, shared_informers: bool
) -> None:
    async with running_cluster(fleet["cluster-3"], "host") as host:
        mine, other = await new_namespace(host, "mine"), await new_namespace(host, "other")
        await host.client.create(configmap("cm", mine, owner="mine"))
        await host.client.create(configmap("cm", other, owner="other"))
        async with mcr.NamespacedCluster(host, mine, shared_informers=shared_informers) as tenant:
            assert (await tenant.cache.get(CONFIGMAP, "cm"))["data"] == {"owner": "mine"}
            informer = tenant.cache.informer(CONFIGMAP)
            keys = set(informer.view())
            assert f"{mine}/cm" in keys and not any(key.startswith(f"{other}/") for key in keys)
            with pytest.raises(mcr.Forbidden):
                tenant.cache.informer(CONFIGMAP, namespace=other)
