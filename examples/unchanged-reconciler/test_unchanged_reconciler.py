"""The same single-cluster reconciler, run against one testbed cluster and then across a changing fleet."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

import mcruntime as mcr
from example_testing import (
    KubeconfigDir,
    admin_cluster,
    create_namespace,
    eventually,
    running,
    write_kubeconfig,
)
from mcruntime.testing import Fleet
from unchanged_reconciler import CHECKSUM_ANNOTATION, CONFIGMAP, ENABLED_LABEL, checksum, parse_arguments, run


def configmap(name: str, namespace: str, *, enabled: bool = True, **data: str) -> dict[str, object]:
    labels = {ENABLED_LABEL: "true"} if enabled else {}
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "data": data,
    }


async def annotated(cluster: mcr.Cluster, namespace: str, name: str) -> bool:
    """Whether the ConfigMap carries the checksum of its current data."""
    current = await cluster.client.get(CONFIGMAP, name, namespace=namespace)
    return (current["metadata"].get("annotations") or {}).get(CHECKSUM_ANNOTATION) == checksum(current)


async def test_single_cluster_mode(fleet: Fleet, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    namespace = f"unchanged-{uuid.uuid4().hex[:8]}"
    monkeypatch.setenv(
        "KUBECONFIG", str(write_kubeconfig(tmp_path / "config", fleet["cluster-1"].kubeconfig()))
    )
    async with admin_cluster(fleet["cluster-1"]) as cluster:
        await create_namespace(cluster, namespace)
        await cluster.client.create(configmap("settings", namespace, mode="fast"))
        await cluster.client.create(configmap("ignored", namespace, enabled=False, mode="slow"))
        async with running(run(parse_arguments(["--single", "--namespace", namespace])), "unchanged"):
            await eventually(lambda: annotated(cluster, namespace, "settings"), "settings annotated")
            await cluster.client.patch(CONFIGMAP, "settings", {"data": {"mode": "slow"}}, namespace=namespace)
            await eventually(
                lambda: annotated(cluster, namespace, "settings"), "the checksum follows the data"
            )
        ignored = await cluster.client.get(CONFIGMAP, "ignored", namespace=namespace)
        assert CHECKSUM_ANNOTATION not in (ignored["metadata"].get("annotations") or {})


async def test_fleet_mode_with_a_cluster_joining(fleet: Fleet, tmp_path: Path) -> None:
    namespace = f"unchanged-{uuid.uuid4().hex[:8]}"
    fleet_dir = KubeconfigDir(tmp_path / "fleet")
    fleet_dir.add(fleet["cluster-2"])
    arguments = parse_arguments([str(fleet_dir.path), "--namespace", namespace])
    async with admin_cluster(fleet["cluster-2"]) as two, admin_cluster(fleet["cluster-3"]) as three:
        for cluster, value in ((two, "two"), (three, "three")):
            await create_namespace(cluster, namespace)
            await cluster.client.create(configmap("settings", namespace, origin=value))
        async with running(run(arguments), "unchanged"):
            await eventually(lambda: annotated(two, namespace, "settings"), "annotated in cluster-2")
            # Each cluster's object got the checksum of its own data: reads and writes followed the request.
            fleet_dir.add(fleet["cluster-3"])
            await eventually(
                lambda: annotated(three, namespace, "settings"), "annotated in cluster-3 once it joined"
            )
            first = await two.client.get(CONFIGMAP, "settings", namespace=namespace)
            second = await three.client.get(CONFIGMAP, "settings", namespace=namespace)
            assert (
                first["metadata"]["annotations"][CHECKSUM_ANNOTATION]
                != (second["metadata"]["annotations"][CHECKSUM_ANNOTATION])
            )
