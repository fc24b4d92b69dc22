"""TLS material costs no open file per cluster, and one context per shared session.

S12 (10,000 clusters on one replica) found a memfd per cluster holding its
CA: 10,000 descriptors of a 20,000 limit before a single watch. The CA needs
no file at all. The sharding test at 10,000 cluster names over three servers
(``test_sharding_scale.py``) then found the client certificate and key held
the same way: two memfds per cluster, because clusters opened together each
built a TLS context of their own before any had made the shared session, and
each kept its files for as long as it ran. The limit ran out at about 9,000
clusters per replica ("Too many open files"). Now the clusters of one sharing
key build one context between them, and a context's files are closed once
OpenSSL has read them. (Typed kubernetes-asyncio clients still get files, which
``test_key_material.py`` checks.)
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

import pytest
from kube_helpers import running_cluster

import mcruntime as mcr
from mcruntime._client.tls import MaterialPaths
from mcruntime.testing import Fleet

NAMESPACE = mcr.Kind("v1", "Namespace")


def memory_files(marker: str) -> list[str]:
    """This process's open in-memory files whose name contains ``marker``."""
    found = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if marker in target:
            found.append(target)
    return found


async def test_a_cluster_with_an_inline_ca_holds_no_file_for_it(fleet: Fleet) -> None:
    plane = fleet["cluster-1"]
    assert plane.kubeconfig()["clusters"][0]["cluster"]["certificate-authority-data"]
    before = memory_files("mcruntime-certificate-authority")
    async with running_cluster(plane, "ca-in-memory") as cluster:
        assert await cluster.client.get(NAMESPACE, "default") is not None
        assert memory_files("mcruntime-certificate-authority") == before


async def test_clusters_opened_together_build_one_context_and_keep_no_key_file(
    fleet: Fleet, monkeypatch: pytest.MonkeyPatch
) -> None:
    plane = fleet["cluster-3"]
    document = plane.kubeconfig()
    assert document["users"][0]["user"]["client-key-data"]  # the identity is in the TLS handshake
    config = mcr.kubeconfig_from_dict(document)
    built: list[str] = []
    build = MaterialPaths.ssl_context

    def counted(self: MaterialPaths, name: str, cluster: Any, user: Any) -> Any:
        built.append(name)
        return build(self, name, cluster, user)

    monkeypatch.setattr(MaterialPaths, "ssl_context", counted)
    before = memory_files("mcruntime-client")
    clusters = [mcr.Cluster(f"together-{index}", config) for index in range(40)]
    try:
        await asyncio.gather(*(cluster.start() for cluster in clusters))
        answers = await asyncio.gather(*(cluster.client.get(NAMESPACE, "default") for cluster in clusters))
        assert all(answer is not None for answer in answers)
        assert len(built) == 1, built  # one certificate load for the forty, not one each
        assert len({id(cluster.transport._session) for cluster in clusters}) == 1
        assert memory_files("mcruntime-client") == before  # no key or certificate file held
    finally:
        await asyncio.gather(*(cluster.stop() for cluster in clusters))
