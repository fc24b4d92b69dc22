"""configmap-logger against testbed clusters that are added and removed while it runs."""

from __future__ import annotations

import logging
import uuid
from pathlib import Path

import pytest

from configmap_logger import build, parse_arguments, provider_for
from example_testing import KubeconfigDir, admin_cluster, create_namespace, eventually, running
from mcruntime.testing import Fleet


def configmap(name: str, namespace: str) -> dict[str, object]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": namespace}}


async def test_logs_configmaps_of_clusters_as_they_come_and_go(
    fleet: Fleet, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="configmap_logger")
    namespace = f"cm-logger-{uuid.uuid4().hex[:8]}"
    fleet_dir = KubeconfigDir(tmp_path / "fleet")
    fleet_dir.add(fleet["cluster-1"])
    arguments = parse_arguments([str(fleet_dir.path), "--namespace", namespace])
    manager = build(provider_for(arguments), namespace=arguments.namespace, handle_signals=False)

    def logged(cluster: str, name: str) -> bool:
        line = f"ConfigMap {namespace}/{name} in cluster {cluster!r}"
        return any(record.getMessage() == line for record in caplog.records)

    async with admin_cluster(fleet["cluster-1"]) as first, admin_cluster(fleet["cluster-2"]) as second:
        for cluster in (first, second):
            await create_namespace(cluster, namespace)
        await first.client.create(configmap("before-start", namespace))

        async with running(manager.start(), "configmap-logger"):
            await eventually(
                lambda: logged("cluster-1", "before-start"), "existing ConfigMap of cluster-1 logged"
            )
            await first.client.create(configmap("while-running", namespace))
            await eventually(
                lambda: logged("cluster-1", "while-running"), "new ConfigMap of cluster-1 logged"
            )

            # A cluster joins by its kubeconfig file appearing.
            await second.client.create(configmap("in-second", namespace))
            fleet_dir.add(fleet["cluster-2"])
            await eventually(
                lambda: logged("cluster-2", "in-second"), "ConfigMap of the joining cluster-2 logged"
            )

            # ...and leaves by its file being deleted: its ConfigMaps are no longer logged.
            fleet_dir.remove("cluster-2")
            await eventually(lambda: "cluster-2" not in manager.clusters(), "cluster-2 let go")
            await second.client.create(configmap("after-leaving", namespace))
            await first.client.create(configmap("marker", namespace))
            await eventually(lambda: logged("cluster-1", "marker"), "a later ConfigMap of cluster-1 logged")
            assert not logged("cluster-2", "after-leaving")

    # Each ConfigMap is logged with the cluster it is in, never with another one.
    assert not logged("cluster-2", "while-running") and not logged("cluster-1", "in-second")
