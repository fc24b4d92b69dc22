"""A cluster's CA is public and loaded from memory: no open file per cluster for it.

S12 (10,000 clusters on one replica) found a memfd per cluster holding its
CA: 10,000 descriptors of a 20,000 limit before a single watch. Keys stay in
memfds (``test_key_material.py``); the CA needs no file at all.
"""

from __future__ import annotations

import os

from kube_helpers import running_cluster

import mcruntime as mcr
from mcruntime.testing import Fleet


def ca_files() -> list[str]:
    """This process's open in-memory files that hold a CA."""
    found = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if "mcruntime-certificate-authority" in target:
            found.append(target)
    return found


async def test_a_cluster_with_an_inline_ca_holds_no_file_for_it(fleet: Fleet) -> None:
    plane = fleet["cluster-1"]
    assert plane.kubeconfig()["clusters"][0]["cluster"]["certificate-authority-data"]
    before = ca_files()
    async with running_cluster(plane, "ca-in-memory") as cluster:
        assert await cluster.client.get(mcr.Kind("v1", "Namespace"), "default") is not None
        assert ca_files() == before
