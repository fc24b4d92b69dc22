"""Clusters with workloads: real Job, garbage-collection and namespace controllers, kwok nodes."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import yaml
from kube_helpers import new_namespace, running_cluster

import mcruntime as mcr
from mcruntime.testing import (
    CONTROLLERS,
    EXIT_CODE_ANNOTATION,
    ControlPlane,
    Fleet,
    TestbedError,
    Workloads,
    backend_named,
    live_processes,
    wait_until,
)
from mcruntime.testing._stages import stages

JOB = mcr.Kind("batch/v1", "Job")
POD = mcr.Kind("v1", "Pod")
NODE = mcr.Kind("v1", "Node")
NAMESPACE = mcr.Kind("v1", "Namespace")
CONFIGMAP = mcr.Kind("v1", "ConfigMap")


def job(name: str, namespace: str, annotations: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "backoffLimit": 0,
            "template": {
                "metadata": {"annotations": annotations or {}},
                "spec": {"restartPolicy": "Never", "containers": [{"name": "main", "image": "busybox:1.36"}]},
            },
        },
    }


def condition(obj: dict[str, Any], kind: str) -> bool:
    return any(
        c.get("type") == kind and c.get("status") == "True"
        for c in (obj.get("status") or {}).get("conditions") or []
    )


async def job_pods(cluster: mcr.Cluster, namespace: str, name: str) -> list[dict[str, Any]]:
    listed = await cluster.client.list(POD, namespace=namespace, label_selector=f"job-name={name}")
    return list(listed.items)


async def test_a_job_is_scheduled_on_a_kwok_node_and_completes(workload_fleet: Fleet) -> None:
    async with running_cluster(workload_fleet["cluster-1"]) as cluster:
        namespace = await new_namespace(cluster)
        await cluster.client.create(job("ok", namespace))

        async def complete() -> bool:
            return condition(await cluster.client.get(JOB, "ok", namespace=namespace), "Complete")

        await wait_until(complete, timeout=30)
        (pod,) = await job_pods(cluster, namespace, "ok")
        assert pod["spec"]["nodeName"] == "kwok-node-1"
        assert pod["status"]["phase"] == "Succeeded"
        assert pod["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 0
        finished = await cluster.client.get(JOB, "ok", namespace=namespace)
        assert finished["status"]["succeeded"] == 1


async def test_the_exit_code_annotation_fails_the_pod_and_its_job(workload_fleet: Fleet) -> None:
    async with running_cluster(workload_fleet["cluster-2"]) as cluster:
        namespace = await new_namespace(cluster)
        await cluster.client.create(job("doomed", namespace, {EXIT_CODE_ANNOTATION: "3"}))

        async def failed() -> bool:
            return condition(await cluster.client.get(JOB, "doomed", namespace=namespace), "Failed")

        await wait_until(failed, timeout=30)
        (pod,) = await job_pods(cluster, namespace, "doomed")
        assert pod["status"]["phase"] == "Failed"
        assert pod["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 3
        failed_job = await cluster.client.get(JOB, "doomed", namespace=namespace)
        assert failed_job["status"]["failed"] == 1
        assert not condition(failed_job, "Complete")


async def test_background_deletion_of_a_job_removes_its_pods(workload_fleet: Fleet) -> None:
    async with running_cluster(workload_fleet["cluster-3"]) as cluster:
        namespace = await new_namespace(cluster)
        await cluster.client.create(job("collected", namespace))

        async def has_pod() -> bool:
            return len(await job_pods(cluster, namespace, "collected")) == 1

        await wait_until(has_pod, timeout=30)
        await cluster.client.delete(JOB, "collected", namespace=namespace, propagation_policy="Background")

        async def pods_gone() -> bool:
            return not await job_pods(cluster, namespace, "collected")

        await wait_until(pods_gone, timeout=30)


async def test_a_deleted_namespace_finishes_terminating(workload_fleet: Fleet) -> None:
    async with running_cluster(workload_fleet["cluster-1"]) as cluster:
        namespace = await new_namespace(cluster)
        await cluster.client.create(
            {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "content", "namespace": namespace}}
        )
        await cluster.client.delete(NAMESPACE, namespace)

        async def gone() -> bool:
            try:
                await cluster.client.get(NAMESPACE, namespace)
            except mcr.NotFound:
                return True
            return False

        await wait_until(gone, timeout=30)


async def test_plain_clusters_stay_plain(testbed: Fleet) -> None:
    plane = testbed.add()
    try:
        assert plane.workloads is None
        assert [p.name for p in plane.processes()] == [f"kube-apiserver[{plane.name}/primary]"]
        async with running_cluster(plane) as cluster:
            assert (await cluster.client.list(NODE)).items == []
    finally:
        testbed.remove(plane.name)


@pytest.mark.testbed_workloads
async def test_stop_and_start_take_the_workloads_along(fresh_cluster: ControlPlane) -> None:
    workloads = fresh_cluster.workloads
    assert workloads is not None

    def states() -> list[bool]:
        return [process.running for process in workloads.processes()]

    assert states() == [True, True, True]
    assert workloads.rss_bytes() > 0
    fresh_cluster.stop()
    assert states() == [False, False, False]
    assert workloads.rss_bytes() == 0
    fresh_cluster.start()
    assert states() == [True, True, True]
    async with running_cluster(fresh_cluster) as cluster:
        namespace = await new_namespace(cluster)
        await cluster.client.create(job("again", namespace))

        async def complete() -> bool:
            return condition(await cluster.client.get(JOB, "again", namespace=namespace), "Complete")

        await wait_until(complete, timeout=30)


@pytest.mark.testbed_workloads
def test_workloads_cannot_be_added_twice(fresh_cluster: ControlPlane, testbed: Fleet) -> None:
    with pytest.raises(TestbedError, match="already runs workloads"):
        fresh_cluster.run_workloads(testbed.workload_assets)


def test_a_component_that_cannot_start_is_named_and_the_others_are_stopped(testbed: Fleet) -> None:
    plane = testbed.add()
    try:
        broken = dataclasses.replace(testbed.workload_assets, kwok=Path("/bin/false"))
        with pytest.raises(TestbedError, match=rf"{plane.name}\b.*kwok|kwok\[{plane.name}\]"):
            plane.run_workloads(broken, timeout=20)
        assert plane.workloads is None
        assert [p.name for p in plane.processes()] == [f"kube-apiserver[{plane.name}/primary]"]
        leftovers = [p.name for p in live_processes() if f"[{plane.name}" in p.name]
        assert all(name.startswith("kube-apiserver") for name in leftovers)
    finally:
        testbed.remove(plane.name)


def test_a_cluster_needs_at_least_one_node(testbed: Fleet, tmp_path: Any) -> None:
    plane = ControlPlane(
        "nodeless", etcd=testbed.etcd, binary=testbed.assets.kube_apiserver, directory=tmp_path
    )
    with pytest.raises(TestbedError, match=r"nodeless: .* at least one node, not 0"):
        Workloads(plane, testbed.workload_assets, plane.backend, nodes=0)


def test_workloads_need_a_running_cluster(testbed: Fleet, tmp_path: Any) -> None:
    plane = ControlPlane(
        "stopped", etcd=testbed.etcd, binary=testbed.assets.kube_apiserver, directory=tmp_path
    )
    with pytest.raises(TestbedError, match="stopped: start the cluster before adding workloads"):
        plane.run_workloads(testbed.workload_assets)


def test_the_stages_document_round_trips_and_covers_every_phase() -> None:
    documents = list(yaml.safe_load_all(yaml.safe_dump_all(stages(1.5))))
    names = [document["metadata"]["name"] for document in documents]
    assert names == ["node-ready", "pod-running", "pod-succeeded", "pod-failed", "pod-deleted"]
    delays = {d["metadata"]["name"]: d["spec"].get("delay") for d in documents}
    assert delays["pod-succeeded"] == delays["pod-failed"] == {"durationMilliseconds": 1500}
    assert delays["pod-running"] is None


def test_the_controller_manager_runs_no_node_lifecycle_controller() -> None:
    # kwok's nodes have no kubelet heartbeat; the node lifecycle controller would taint them.
    assert "node-lifecycle-controller" not in CONTROLLERS
    assert {"job-controller", "garbage-collector-controller", "namespace-controller"} <= set(CONTROLLERS)


def test_an_unknown_backend_is_named_in_the_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MCRUNTIME_TESTBED_BACKEND", "vm")
    with pytest.raises(TestbedError, match="MCRUNTIME_TESTBED_BACKEND='vm' is not a testbed backend"):
        backend_named()
    with pytest.raises(TestbedError, match="backend='podman' is not a testbed backend"):
        backend_named("podman")


def test_the_command_line_starts_clusters_with_workloads_and_reports_their_memory(tmp_path: Any) -> None:
    import subprocess
    import sys

    installed = subprocess.run(
        [sys.executable, "-m", "mcruntime.testing", "install", "--workloads"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert installed.returncode == 0, installed.stderr
    for name in ("kube-controller-manager:", "kube-scheduler:", "kwok:", "export KUBEBUILDER_ASSETS="):
        assert name in installed.stdout
    started = subprocess.run(
        [sys.executable, "-m", "mcruntime.testing", "fleet", "--clusters", "1", "--workloads", "--exit"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert started.returncode == 0, started.stderr
    assert "workloads: " in started.stdout
    assert "controllers + scheduler + kwok RSS" in started.stdout
