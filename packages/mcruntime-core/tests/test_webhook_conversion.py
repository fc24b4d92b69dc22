"""Conversion webhooks: a CRD served in two versions, converted through the hub by the runtime."""

from __future__ import annotations

from typing import Any

import pytest
from kube_helpers import unique
from webhook_helpers import (
    config_of,
    fleet_manager,
    install_crd,
    kind_crd,
    new_group,
    serving,
    webhook_options,
)

import mcruntime as mcr
from mcruntime.testing import Fleet


def to_hub(obj: dict[str, Any]) -> dict[str, Any]:
    """v1alpha1 keeps the image in spec.img; v1 (the hub) in spec.image."""
    spec = dict(obj.get("spec") or {})
    spec["image"] = spec.pop("img", None)
    return {**obj, "spec": spec}


async def from_hub(obj: dict[str, Any]) -> dict[str, Any]:
    spec = dict(obj.get("spec") or {})
    if spec.get("image") == "v1-only":
        raise mcr.ConversionFailed("image 'v1-only' has no v1alpha1 form")
    spec["img"] = spec.pop("image", None)
    return {**obj, "spec": spec}


async def test_objects_convert_both_ways_in_every_cluster(fleet: Fleet) -> None:
    group, namespace = new_group(), "default"
    old, new = mcr.Kind(f"{group}/v1alpha1", "Test"), mcr.Kind(f"{group}/v1", "Test")
    for plane in fleet:
        await install_crd(plane, kind_crd(group, ("v1alpha1", "v1"), storage="v1"))
    manager = fleet_manager(fleet, webhook_options())
    mcr.webhook_managed_by(manager).for_(new).with_conversion(
        hub="v1", to_hub={"v1alpha1": to_hub}, from_hub={"v1alpha1": from_hub}
    ).complete()
    names = [plane.name for plane in fleet]
    async with serving(manager, names):
        for name in names:
            async with mcr.Cluster("caller", config_of(fleet[name])) as cluster:
                written_old = unique("old")
                await cluster.client.create(
                    {
                        "apiVersion": old.api_version,
                        "kind": "Test",
                        "metadata": {"name": written_old, "namespace": namespace},
                        "spec": {"img": f"image-{name}"},
                    }
                )
                read_new = await cluster.client.get(new, written_old, namespace=namespace)
                assert read_new["apiVersion"] == new.api_version
                assert read_new["spec"] == {"image": f"image-{name}"}

                written_new = unique("new")
                await cluster.client.create(
                    {
                        "apiVersion": new.api_version,
                        "kind": "Test",
                        "metadata": {"name": written_new, "namespace": namespace},
                        "spec": {"image": "busybox"},
                    }
                )
                read_old = await cluster.client.get(old, written_new, namespace=namespace)
                assert read_old["apiVersion"] == old.api_version and read_old["spec"] == {"img": "busybox"}

                refused = unique("refused")
                await cluster.client.create(
                    {
                        "apiVersion": new.api_version,
                        "kind": "Test",
                        "metadata": {"name": refused, "namespace": namespace},
                        "spec": {"image": "v1-only"},
                    }
                )
                with pytest.raises(mcr.APIError, match="image 'v1-only' has no v1alpha1 form"):
                    await cluster.client.get(old, refused, namespace=namespace)
                await cluster.client.delete(new, refused, namespace=namespace)


async def test_the_crd_points_at_its_clusters_url_with_the_ca_bundle(fleet: Fleet) -> None:
    group = new_group()
    plane = fleet["cluster-3"]
    await install_crd(plane, kind_crd(group, ("v1alpha1", "v1"), storage="v1"))
    manager = mcr.Manager(
        mcr.StaticProvider({plane.name: config_of(plane)}), handle_signals=False, webhook=webhook_options()
    )
    mcr.webhook_managed_by(manager).for_(mcr.Kind(f"{group}/v1", "Test")).with_conversion(
        hub="v1", to_hub={"v1alpha1": to_hub}, from_hub={"v1alpha1": from_hub}
    ).complete()
    async with serving(manager, [plane.name]), mcr.Cluster("check", config_of(plane)) as cluster:
        crd = await cluster.client.get(
            mcr.Kind("apiextensions.k8s.io/v1", "CustomResourceDefinition"), f"tests.{group}"
        )
        webhook = crd["spec"]["conversion"]["webhook"]
        assert crd["spec"]["conversion"]["strategy"] == "Webhook"
        assert webhook["clientConfig"]["url"] == manager.webhook.conversion_url(plane.name, group, "Test")
        assert webhook["clientConfig"]["url"].endswith(f"/clusters/{plane.name}/convert/{group}/Test")
        assert webhook["conversionReviewVersions"] == ["v1"]
        assert webhook["clientConfig"]["caBundle"]
