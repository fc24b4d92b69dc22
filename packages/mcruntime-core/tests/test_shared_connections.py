"""Clusters that reach one API server the same way share connections, and nothing else.

A fleet of token users on a few servers must not pay a TLS handshake and an
idle socket per cluster (client-go shares a transport per TLS configuration).
Sharing must never couple the clusters: a revoked token, a stopped cluster or
a client-certificate identity stays that cluster's own business.
"""

from __future__ import annotations

import asyncio
from contextlib import AsyncExitStack

import pytest
from kube_helpers import CONFIGMAP, configmap, connections_to, unique

import mcruntime as mcr
from mcruntime._client.pool import REQUESTS_IN_FLIGHT, Turns, session_pool
from mcruntime.cache import Informer
from mcruntime.testing import ControlPlane, wait_until


def _config(plane: ControlPlane, user: object = None) -> mcr.ClusterConfig:
    return mcr.kubeconfig_from_dict(plane.kubeconfig(user))  # type: ignore[arg-type]


async def _open_one_by_one(
    stack: AsyncExitStack, plane: ControlPlane, users: list[object], share: bool
) -> list[mcr.Cluster]:
    """Start each cluster once the last is idle, so a shared pool can hand on its connection."""
    options = mcr.ClusterOptions(share_connections=share)
    clusters = []
    for i, user in enumerate(users):
        cluster = await stack.enter_async_context(mcr.Cluster(f"tenant-{i}", _config(plane, user), options))

        def answered(cluster: mcr.Cluster = cluster) -> bool:
            return cluster.health.healthy

        await wait_until(answered, timeout=30, what="the first probe answered")
        await cluster.client.list(CONFIGMAP, namespace="default")
        clusters.append(cluster)
    return clusters


async def test_token_users_of_one_server_share_connections_and_keep_their_own_identity(
    fresh_cluster: ControlPlane,
) -> None:
    plane = fresh_cluster
    port = plane.apiserver.port
    users: list[object] = [plane.add_token_user(unique("shared")) for _ in range(8)]
    async with AsyncExitStack() as stack:
        apart = await _open_one_by_one(stack, plane, users, share=False)
        unshared = connections_to(port)
        assert not any(cluster.transport.shared for cluster in apart)
    async with AsyncExitStack() as stack:
        clusters = await _open_one_by_one(stack, plane, users, share=True)
        shared = connections_to(port)
        assert all(cluster.transport.shared for cluster in clusters)
        # A client certificate is part of the handshake: pooled only with the very same certificate.
        admin = await stack.enter_async_context(mcr.Cluster("admin", _config(plane)))
        again = await stack.enter_async_context(mcr.Cluster("admin-again", _config(plane)))
        await admin.client.list(CONFIGMAP, namespace="default")
        await again.client.list(CONFIGMAP, namespace="default")
        assert admin.transport.shared and again.transport.shared
        pool = session_pool()
        assert pool.users(admin.transport._sharing_key() or "") == 2
        assert pool.users(clusters[0].transport._sharing_key() or "") == len(clusters)
        # Eight clusters opened one after another: each kept its own connections apart,
        # and handed them on when pooled.
        print(f"connections to the server: {unshared} with a pool per cluster, {shared} pooled")
        assert unshared >= len(users) and shared <= 3
        # Each request still carries its own cluster's token: the server tells them apart.
        for cluster, user in zip(clusters, users, strict=True):
            review = await cluster.client.create(
                {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview", "metadata": {}}
            )
            name = getattr(user, "name", "")
            assert review["status"]["userInfo"]["username"].endswith(":" + name.rsplit(":", 1)[-1])


async def test_a_revoked_or_stopped_cluster_costs_its_pool_partners_nothing(
    fresh_cluster: ControlPlane,
) -> None:
    plane = fresh_cluster
    revoked_name, healthy_name = unique("revoked"), unique("healthy")
    revoked_user, healthy_user = plane.add_token_user(revoked_name), plane.add_token_user(healthy_name)
    namespace = "default"
    seen: list[str] = []
    options = mcr.ClusterOptions(health_probe_interval=0.5, health_credential_interval=0.5)
    async with mcr.Cluster("healthy", _config(plane, healthy_user), options) as healthy:
        informer = Informer(healthy.client, CONFIGMAP, namespace=namespace)
        informer.add_handler(
            mcr.ResourceEventHandler(on_add=lambda obj, _initial: seen.append(obj["metadata"]["name"]))
        )
        watching = asyncio.create_task(informer.run())
        try:
            assert await informer.wait_for_sync(30)
            restarts = informer.stats.watch_restarts
            async with mcr.Cluster("revoked", _config(plane, revoked_user), options) as revoked:
                assert revoked.transport.shared and healthy.transport.shared
                await revoked.client.list(CONFIGMAP, namespace=namespace)
                plane.revoke_token_user(revoked_name)
                await wait_until(lambda: not revoked.health.healthy, timeout=30)
                assert healthy.health.healthy
                first = unique("during")
                await healthy.client.create(configmap(first, namespace))
                await wait_until(lambda: first in seen, timeout=30)
            # The revoked cluster stopped, closing its own watches and requests only.
            assert healthy.transport.shared and not healthy.transport.closed
            second = unique("after")
            await healthy.client.create(configmap(second, namespace))
            await wait_until(lambda: second in seen, timeout=30)  # the same watch, still delivering
            assert informer.stats.watch_restarts == restarts  # never cut by its partner's revocation or stop
        finally:
            watching.cancel()
            await asyncio.gather(watching, return_exceptions=True)


async def test_a_burst_from_many_clusters_reuses_a_bounded_set_of_connections(
    fresh_cluster: ControlPlane,
) -> None:
    """Three hundred clusters of one server start and list at once: a few dozen handshakes, not 300."""
    plane = fresh_cluster
    port = plane.apiserver.port
    count = 300
    async with AsyncExitStack() as stack:
        clusters = [
            await stack.enter_async_context(mcr.Cluster(f"burst-{i}", _config(plane))) for i in range(count)
        ]
        answers = await asyncio.gather(
            *(cluster.client.list(CONFIGMAP, namespace="default") for cluster in clusters)
        )
        await wait_until(lambda: all(cluster.health.healthy for cluster in clusters), timeout=60)
        assert len(answers) == count and all(cluster.transport.shared for cluster in clusters)
        assert session_pool().turns(clusters[0].transport._sharing_key() or "") is not None
        connections = connections_to(port)
        print(f"{count} clusters probing and listing at once: {connections} connections to the server")
        # Every probe and list went out, through at most REQUESTS_IN_FLIGHT connections at once.
        assert connections <= REQUESTS_IN_FLIGHT


async def test_a_freed_place_goes_to_the_waiting_clusters_in_turn() -> None:
    """A cluster with a long queue holds back another of its server by one request, not its whole queue."""
    turns = Turns(limit=2)
    granted: list[str] = []

    async def request(cluster: str) -> None:
        await turns.acquire(cluster)
        granted.append(cluster)

    await request("busy")
    await request("busy")  # both places taken
    queued = [asyncio.ensure_future(request("busy")) for _ in range(10)]
    await wait_until(lambda: turns.waiting("busy") == 10)
    late = asyncio.ensure_future(request("quiet"))
    await wait_until(lambda: turns.waiting("quiet") == 1)
    for _ in range(11):  # each freed place passes straight on to a waiting request
        turns.release()
        await asyncio.sleep(0)  # let the granted request run (ordering, not waiting on a condition)
    await asyncio.gather(*queued, late)
    assert granted[2:5] == ["busy", "quiet", "busy"], granted
    assert turns.in_flight == 2 and turns.waiting() == 0
    # A waiter that gives up leaves the queue, and a place granted to it as it gave up passes on.
    gone = asyncio.ensure_future(request("gone"))
    stays = asyncio.ensure_future(request("stays"))
    await wait_until(lambda: turns.waiting() == 2)
    gone.cancel()
    turns.release()
    await asyncio.gather(gone, return_exceptions=True)
    await stays
    assert granted[-1] == "stays" and turns.in_flight == 2 and turns.waiting() == 0


async def test_the_bound_on_requests_in_flight_is_an_option(fresh_cluster: ControlPlane) -> None:
    options = mcr.ClusterOptions(server_requests_in_flight=3)
    async with mcr.Cluster("bounded", _config(fresh_cluster), options) as cluster:
        await cluster.client.list(CONFIGMAP, namespace="default")
        turns = session_pool().turns(cluster.transport._sharing_key() or "")
        assert turns is not None and turns.limit == 3
        lists = [cluster.client.list(CONFIGMAP, namespace="default") for _ in range(20)]
        assert len(await asyncio.gather(*lists)) == 20
        assert turns.in_flight == 0
    with pytest.raises(ValueError, match="server_requests_in_flight must be at least 1, got 0"):
        mcr.ClusterOptions(server_requests_in_flight=0)


async def test_a_probe_waits_its_turn_while_the_queue_moves_and_fails_when_it_stands_still(
    fresh_cluster: ControlPlane,
) -> None:
    """A busy shared session is not a hung server: the probe's timeout starts with its turn."""
    async with mcr.Cluster("patient", _config(fresh_cluster)) as cluster:
        await cluster.client.list(CONFIGMAP, namespace="default")
        turns = session_pool().turns(cluster.transport._sharing_key() or "")
        assert turns is not None
        for _ in range(turns.limit):  # every place in flight taken, as by slow requests
            await turns.acquire("others")
        ahead = [asyncio.ensure_future(turns.acquire("others")) for _ in range(5)]
        await asyncio.sleep(0)  # let them queue up first (ordering, not waiting on a condition)
        probing = asyncio.ensure_future(cluster.transport.probe(0.5))
        await wait_until(lambda: turns.waiting("patient") == 1)
        # The queue moves: one answer and one freed place every 0.3 s, and places go to the
        # waiting clusters in turn: the probe's comes second, after about 0.6 s, past its 0.5 s timeout.
        while turns.waiting("patient"):
            await asyncio.sleep(0.3)  # the pace of the simulated answers, not a wait for a condition
            turns.answered()
            turns.release()
        assert turns.waiting("others") == 4  # one of the other cluster's went first, then the probe
        assert await probing is None
        # Now the queue stands still (every place taken, no answers): the probe reports no answer.
        while turns.waiting("others"):
            turns.release()
        await asyncio.gather(*ahead)
        while turns.free:
            await turns.acquire("others")
        # It answers (a deadline, not a figure: it used to wait for a place forever).
        verdict = await asyncio.wait_for(cluster.transport.probe(0.5), 60)
        assert verdict is not None and verdict[1], verdict
        for _ in range(turns.limit):
            turns.release()
