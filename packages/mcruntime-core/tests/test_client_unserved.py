"""A kind the server stopped serving is ``KindNotFound``, never ``NotFound``: the object may still exist.

With a CRD's version set to ``served: false``, the API server answers that
version's paths with its mux's plain ``404 page not found``. Read as
``NotFound``, ``get_or_none`` returned ``None`` for an object that still
existed (readable at the other version), and a reconciler that cleans up what
is gone would have acted on a live object.
"""

from __future__ import annotations

import copy

import pytest
from kube_helpers import new_namespace, running_cluster, unique, widget_crd

import mcruntime as mcr
from mcruntime.testing import Fleet, wait_until

CRD = mcr.Kind("apiextensions.k8s.io/v1", "CustomResourceDefinition")


def _two_versions(group: str) -> dict[str, object]:
    crd = widget_crd(group)
    versions = crd["spec"]["versions"]
    beta = copy.deepcopy(versions[0])
    beta.update(name="v1beta1", storage=False)
    versions.append(beta)
    return crd


async def test_a_version_no_longer_served_is_kind_not_found_while_its_object_exists(fleet: Fleet) -> None:
    async with running_cluster(fleet["cluster-1"]) as cluster:
        group = f"{unique('g')}.test.mcruntime.dev"
        await cluster.client.create(_two_versions(group))
        v1, beta = mcr.Kind(f"{group}/v1", "Widget"), mcr.Kind(f"{group}/v1beta1", "Widget")
        namespace = await new_namespace(cluster)
        widget = {
            "apiVersion": f"{group}/v1",
            "kind": "Widget",
            "metadata": {"name": "w1", "namespace": namespace},
        }

        async def created() -> bool:
            try:
                await cluster.client.create(widget)
            except (mcr.KindNotFound, mcr.NotFound):
                return False  # the CRD is not established yet
            return True

        await wait_until(created, what="the Widget created")
        crd = await cluster.client.get(CRD, f"widgets.{group}")
        for version in crd["spec"]["versions"]:
            version["served"] = version["name"] != "v1"
        await cluster.client.update(crd)

        async def unserved() -> bool:
            try:
                await cluster.client.get(v1, "w1", namespace=namespace)
            except mcr.KindNotFound:
                return True
            return False  # NotFound here fails the test: the object exists

        await wait_until(unserved, what="v1 Widgets answered as unserved")
        with pytest.raises(mcr.KindNotFound) as raised:
            await cluster.client.get_or_none(v1, "w1", namespace=namespace)
        assert str(raised.value) == f"cluster {cluster.name!r} serves no Widget in {group}/v1"
        still = await cluster.client.get(beta, "w1", namespace=namespace)
        assert still["metadata"]["name"] == "w1"  # it was never gone


async def test_a_watch_of_a_version_no_longer_served_is_kind_not_found(fleet: Fleet) -> None:
    # Discovery still holds the version (it was served when last asked): the watch's own
    # 404 from the mux must say "not served", naming the apiVersion, not "404 page not found".
    async with running_cluster(fleet["cluster-1"]) as cluster:
        group = f"{unique('g')}.test.mcruntime.dev"
        await cluster.client.create(_two_versions(group))
        v1 = mcr.Kind(f"{group}/v1", "Widget")

        async def listed() -> bool:
            try:
                await cluster.client.list(v1)
            except (mcr.KindNotFound, mcr.NotFound):
                return False  # the CRD is not established yet
            return True

        await wait_until(listed, what="v1 Widgets served")
        crd = await cluster.client.get(CRD, f"widgets.{group}")
        for version in crd["spec"]["versions"]:
            version["served"] = version["name"] != "v1"
        await cluster.client.update(crd)

        said: list[str] = []

        async def refused() -> bool:
            try:
                async for _event in cluster.client.watch(v1, timeout_seconds=1):
                    pass
            except mcr.KindNotFound as error:
                said.append(str(error))
                return True
            return False  # still served: the watch ended on its timeout

        await wait_until(refused, what="the v1 watch refused as unserved")
        assert said == [f"cluster {cluster.name!r} serves no Widget in {group}/v1"]
