"""Discovery is the server's, not the cluster's: clusters of one server share a load.

A fleet of many clusters on few servers (virtual clusters, namespaces, the S12
benchmark's token users) would otherwise ask every server the same two
questions once per cluster at cold start, and again after every failed LIST.
"""

from __future__ import annotations

import asyncio
from contextlib import AsyncExitStack

import pytest
from kube_helpers import CONFIGMAP, running_cluster

import mcruntime as mcr
from mcruntime._base.kind import Resource
from mcruntime.testing import Fleet, wait_until


async def test_clusters_of_one_server_share_one_load_and_another_server_loads_its_own(fleet: Fleet) -> None:
    async with AsyncExitStack() as stack:
        siblings = [
            await stack.enter_async_context(running_cluster(fleet["cluster-1"], f"sibling-{index}"))
            for index in range(20)
        ]
        other = await stack.enter_async_context(running_cluster(fleet["cluster-2"], "elsewhere"))
        before = sum(cluster.client.discovery.requests for cluster in siblings)
        found = await asyncio.gather(*(cluster.client.resource(CONFIGMAP) for cluster in siblings))
        assert {resource.plural for resource in found} == {"configmaps"}
        # One load is two requests (aggregated /api and /apis); twenty clusters alone would send forty.
        assert sum(cluster.client.discovery.requests for cluster in siblings) - before <= 2
        assert (await other.client.resource(CONFIGMAP)).plural == "configmaps"
        # Another server has an answer of its own (other tests' clusters may have loaded it already).
        assert other.client.discovery._shared is not siblings[0].client.discovery._shared
        assert {id(cluster.client.discovery._shared) for cluster in siblings} == {
            id(siblings[0].client.discovery._shared)
        }


async def test_a_sibling_whose_load_fails_does_not_answer_for_the_others(fleet: Fleet) -> None:
    plane = fleet["cluster-3"]
    revoked = plane.kubeconfig(plane.token_user)
    revoked["users"][0]["user"] = {"token": "no-such-token-8d1f"}
    good = plane.kubeconfig(plane.token_user)
    trust = mcr.TrustPolicy.untrusted()
    async with (
        mcr.Cluster("revoked", mcr.kubeconfig_from_dict(revoked, origin="revoked", trust=trust)) as bad,
        mcr.Cluster("good", mcr.kubeconfig_from_dict(good, origin="good", trust=trust)) as fine,
    ):
        # The revoked cluster's load begins first and is held there, so the good one waits on it.
        discovery = bad.client.discovery
        shared = discovery._shared
        assert shared is not None and shared is fine.client.discovery._shared
        release = asyncio.Event()
        load = discovery._load

        async def held() -> dict[mcr.Kind, Resource]:
            await release.wait()
            return await load()

        discovery._load = held  # type: ignore[method-assign]
        failing = asyncio.ensure_future(discovery.refresh())
        await wait_until(lambda: shared.loading is not None, what="the revoked cluster's load begun")
        # A reload, not a lookup: other tests' clusters of this server may have loaded it already.
        waiting = asyncio.ensure_future(fine.client.discovery.refresh())
        await wait_until(lambda: fine.client.discovery._refreshing is not None, what="the good one waiting")
        # While it waits on its sibling's load its own request is as good as on its way: its
        # health probe need not vouch for it meanwhile (a cold start of thousands waits here).
        outstanding = fine.transport.health.outstanding
        assert outstanding is not None
        await wait_until(outstanding, what="the wait counted as a request on its way")
        release.set()
        await waiting
        assert (await fine.client.resource(CONFIGMAP)).plural == "configmaps"
        with pytest.raises(mcr.APIError) as refused:
            await failing
        assert refused.value.status == 401
        assert fine.client.discovery.requests >= 2  # it loaded on its own after the sibling failed
