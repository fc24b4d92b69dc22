"""Client certificates rotate in place, and inline keys live in memory-only files.

Cluster API kubeconfigs authenticate with client certificates; a rotation must
reach new connections without rebuilding the cluster's caches, as a rotated
token does.
"""

from __future__ import annotations

import json
import os
from typing import Any

from kube_helpers import CONFIGMAP, configmap, new_namespace, unique

import mcruntime as mcr
from mcruntime.testing import Fleet, User, running, wait_until


async def _nothing(_request: mcr.Request) -> None:
    return None


async def whoami(cluster: mcr.Cluster) -> str:
    """The user name the API server authenticated the next request as."""
    body = json.dumps({"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}).encode()
    status, _, payload = await cluster.transport.request(
        "POST",
        "/apis/authentication.k8s.io/v1/selfsubjectreviews",
        body=body,
        content_type="application/json",
    )
    assert status == 201, payload
    name: str = json.loads(payload)["status"]["userInfo"]["username"]
    return name


def config_for(plane: Any, user: User) -> mcr.ClusterConfig:
    return mcr.kubeconfig_from_dict(plane.kubeconfig(user), origin=f"{plane.name} as {user.name}")


async def test_a_rotated_client_certificate_reaches_new_requests_without_rebuilding_caches(
    fleet: Fleet,
) -> None:
    plane = fleet["cluster-3"]
    first = plane.add_cert_user(unique("cert-first"), groups=("system:masters",))
    second = plane.add_cert_user(unique("cert-second"), groups=("system:masters",))
    provider = mcr.StaticProvider({"c": config_for(plane, first)})
    manager = mcr.Manager(provider, handle_signals=False)
    mcr.controller_managed_by(manager).named("noop").for_(CONFIGMAP).complete(_nothing)
    async with running(manager):
        cluster = await provider.clusters.wait_engaged("c")
        namespace = await new_namespace(cluster)
        await cluster.client.create(configmap("before", namespace, v="1"))
        await wait_until(lambda: cluster.cache.informers(), timeout=20, what="the controller's informer")
        informer = cluster.cache.informers()[0]
        await wait_until(
            lambda: any(key.endswith("/before") for key in informer.store.objects), timeout=20, what="cached"
        )
        lists = informer.stats.lists
        assert await whoami(cluster) == first.name

        assert await provider.set("c", config_for(plane, second)) is True

        assert await manager.get_cluster("c") is cluster  # the same cluster, caches kept
        assert provider.statuses()["c"].credential_rotations == 1
        assert await whoami(cluster) == second.name  # new connections present the new certificate
        assert cluster.cache.informers() == [informer]
        assert any(key.endswith("/before") for key in informer.store.objects)
        await cluster.client.create(configmap("after", namespace, v="2"))
        await wait_until(
            lambda: any(key.endswith("/after") for key in informer.store.objects), timeout=20, what="watched"
        )
        assert informer.stats.lists == lists  # no relist


async def test_typed_clients_read_inline_keys_from_memory_only_files(fleet: Fleet) -> None:
    from kubernetes_asyncio import client as k8s

    plane = fleet["cluster-2"]
    user = plane.add_cert_user(unique("cert-typed"), groups=("system:masters",))
    async with mcr.Cluster("typed", config_for(plane, user)) as cluster:
        configuration = await cluster.kubernetes_configuration()
        paths = [str(configuration.cert_file), str(configuration.key_file), str(configuration.ssl_ca_cert)]
        assert all(path.startswith("/proc/self/fd/") for path in paths)
        assert all(os.readlink(path).startswith("/memfd:mcruntime-") for path in paths)
        async with k8s.ApiClient(configuration) as api:
            namespaces = await k8s.CoreV1Api(api).list_namespace()
        assert any(item.metadata.name == "default" for item in namespaces.items)
