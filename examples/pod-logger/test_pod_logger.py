"""pod-logger, from its command line, against two testbed clusters named by kubeconfig contexts."""

from __future__ import annotations

import contextlib
import logging
import uuid
from pathlib import Path

import pytest

import mcruntime as mcr
from example_testing import (
    admin_cluster,
    create_namespace,
    eventually,
    merged_kubeconfig,
    running,
    write_kubeconfig,
)
from mcruntime.testing import Fleet
from pod_logger import POD, parse_arguments, run


def pod(name: str, namespace: str) -> dict[str, object]:
    # No node will ever run it: the testbed has none, and the logger only needs the events.
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "automountServiceAccountToken": False,
            "containers": [{"name": "nginx", "image": "nginx"}],
        },
    }


async def prepare(cluster: mcr.Cluster, namespace: str) -> None:
    """The namespace and its default ServiceAccount (made by kube-controller-manager, absent here)."""
    await create_namespace(cluster, namespace)
    with contextlib.suppress(mcr.AlreadyExists):
        await cluster.client.create(
            {
                "apiVersion": "v1",
                "kind": "ServiceAccount",
                "metadata": {"name": "default", "namespace": namespace},
            }
        )


async def test_logs_cluster_namespace_and_name_of_pods_in_both_clusters(
    fleet: Fleet, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="pod_logger")
    namespace = f"pods-{uuid.uuid4().hex[:8]}"
    kubeconfig = write_kubeconfig(
        tmp_path / "config",
        merged_kubeconfig({"cluster1": fleet["cluster-1"], "cluster2": fleet["cluster-2"]}),
    )
    arguments = parse_arguments(["--contexts", "cluster1,cluster2", "--kubeconfig", str(kubeconfig)])

    def lines() -> set[str]:
        return {record.getMessage() for record in caplog.records}

    async with admin_cluster(fleet["cluster-1"]) as one, admin_cluster(fleet["cluster-2"]) as two:
        for cluster in (one, two):
            await prepare(cluster, namespace)
        async with running(run(arguments), "pod-logger"):
            await one.client.create(pod("nginx", namespace))
            await two.client.create(pod("nginx", namespace))
            await two.client.create(pod("redis", namespace))
            expected = {
                f"cluster1 / {namespace} / nginx",
                f"cluster2 / {namespace} / nginx",
                f"cluster2 / {namespace} / redis",
            }
            await eventually(lambda: expected <= lines(), "a line per Pod, with its cluster")
            assert f"cluster1 / {namespace} / redis" not in lines()

            def times_logged() -> int:
                return sum(r.getMessage() == f"cluster1 / {namespace} / nginx" for r in caplog.records)

            count = times_logged()  # counted before the deletion, so its line cannot be missed
            await one.client.delete(POD, "nginx", namespace=namespace, grace_period_seconds=0)
            await eventually(lambda: times_logged() > count, "the deletion logged too")
