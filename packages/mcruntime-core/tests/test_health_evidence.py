"""Health that costs nothing while all is well, on a real control plane.

Traffic is evidence: a server whose watches deliver events is not probed, the
clusters of one server share one reachability probe, and an open circuit lets
a trial request through, so a server that answers again is used at once.
Everything here counts probes and requests; nothing is timed.
"""

from __future__ import annotations

import asyncio
import operator
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from functools import partial

import pytest
from kube_helpers import CONFIGMAP, configmap, hung, unique

import mcruntime as mcr
from mcruntime._client.health import (
    _INCONCLUSIVE_LIMIT,
    HealthRecord,
    HealthState,
    ProbeInconclusive,
    ProbeResult,
)
from mcruntime._client.liveness import ServerLiveness
from mcruntime.cache import Informer
from mcruntime.testing import ControlPlane, wait_until

# When the suite runs in parallel, no other test runs beside this module's:
# it counts the probes a window of silence brings.
pytestmark = pytest.mark.alone


def _config(plane: ControlPlane, user: object = None) -> mcr.ClusterConfig:
    return mcr.kubeconfig_from_dict(plane.kubeconfig(user))  # type: ignore[arg-type]


_NO_RETRY_SOON = mcr.Backoff(base=3600.0, cap=3600.0)
"""After a failed probe, the next is an hour away: whatever closes the circuit, a probe does not."""


def _server(cluster: mcr.Cluster) -> ServerLiveness:
    server = cluster.transport.health.server
    assert server is not None, "the probe loop has not joined its server yet"
    return server


async def test_clusters_of_one_server_share_its_reachability_probe(fresh_cluster: ControlPlane) -> None:
    """Eight idle token users of one server: one of them probes the server, the others never."""
    plane = fresh_cluster
    users = [plane.add_token_user(unique("idle")) for _ in range(8)]
    options = mcr.ClusterOptions(health_probe_interval=0.2, health_credential_interval=3600.0)
    async with AsyncExitStack() as stack:
        clusters = [
            await stack.enter_async_context(mcr.Cluster(f"idle-{i}", _config(plane, user), options))
            for i, user in enumerate(users)
        ]
        await wait_until(lambda: all(cluster.health.healthy for cluster in clusters), timeout=30)
        assert len({id(_server(cluster)) for cluster in clusters}) == 1
        lead = _server(clusters[0]).lead
        first = {cluster.name: cluster.transport.health.probes for cluster in clusters}
        leader = next(cluster for cluster in clusters if cluster.transport.health is lead)
        # Each cluster's credential is checked once at start; only the lead probes again.
        assert {probes for name, probes in first.items() if name != leader.name} == {1}
        await wait_until(lambda: leader.transport.health.probes >= 6, timeout=30)
        for cluster in clusters:
            if cluster is not leader:
                assert cluster.transport.health.probes == 1, cluster.name
        # The lead leaving hands the duty on: another member probes the silent server.
        await leader.stop()
        heir = next(cluster for cluster in clusters if cluster.transport.health is _server(clusters[-1]).lead)
        await wait_until(lambda: heir.transport.health.probes >= 3, timeout=30)
        assert (
            sum(cluster.transport.health.probes for cluster in clusters if cluster not in (leader, heir)) == 6
        )


async def test_a_server_whose_watch_delivers_is_probed_only_after_silence(
    fresh_cluster: ControlPlane,
) -> None:
    """Every probe that runs follows a whole interval in which nothing came from the server."""
    interval = 1.0
    options = mcr.ClusterOptions(health_probe_interval=interval, health_credential_interval=3600.0)
    silences: list[float] = []
    cluster = mcr.Cluster("watched", _config(fresh_cluster), options)
    server_of: list[ServerLiveness] = []
    real_probe = cluster.transport.probe

    async def noting(timeout: float) -> ProbeResult:
        if server_of:
            silences.append(time.monotonic() - server_of[0].heard_at)
        return await real_probe(timeout)

    cluster.transport.probe = noting  # type: ignore[method-assign]
    async with cluster:
        await wait_until(lambda: cluster.health.healthy, timeout=30)
        server_of.append(_server(cluster))
        seen: list[str] = []
        informer = Informer(cluster.client, CONFIGMAP, namespace="default")
        informer.add_handler(
            mcr.ResourceEventHandler(on_add=lambda obj, _i: seen.append(obj["metadata"]["name"]))
        )
        watching = asyncio.create_task(informer.run())
        try:
            assert await informer.wait_for_sync(30)
            for _ in range(10):
                name = unique("event")
                await cluster.client.create(configmap(name, "default"))
                await wait_until(partial(operator.contains, seen, name), timeout=30)
            # Now silence: the server gets probed again, and only then.
            probes = cluster.transport.health.probes
            await wait_until(lambda: cluster.transport.health.probes > probes + 1, timeout=30)
        finally:
            watching.cancel()
            await asyncio.gather(watching, return_exceptions=True)
    assert silences, "the silent server was never probed"
    assert all(silence >= interval for silence in silences), silences


async def _until_trial_ready(cluster: mcr.Cluster) -> None:
    health = cluster.transport.health
    await wait_until(lambda: health.unreachable, timeout=30)
    await wait_until(lambda: health.trial_ready, timeout=30)


async def test_a_write_right_after_a_hung_server_answers_again_goes_through(
    fresh_cluster: ControlPlane,
) -> None:
    """The open circuit is half-open: the first write after SIGCONT is the trial, and closes it."""
    namespace = "default"
    options = mcr.ClusterOptions(
        health_probe_interval=3600.0, health_credential_interval=3600.0, backoff=_NO_RETRY_SOON
    )
    async with mcr.Cluster("resumed", _config(fresh_cluster), options) as cluster:
        await wait_until(lambda: cluster.health.healthy, timeout=30)
        health = cluster.transport.health
        with hung(fresh_cluster):
            health.suspect()  # as a failed request would: the probe looks at once and finds no answer
            await _until_trial_ready(cluster)
            probes = health.probes  # the probe that found no answer is the last for an hour
        # Answering again, and no probe will tell: the write itself finds out.
        created = await cluster.client.create(configmap(unique("after"), namespace))
        assert created["metadata"]["resourceVersion"]
        assert not health.unreachable and cluster.health.healthy
        assert health.probes == probes


async def test_an_open_circuit_lets_one_trial_through_and_refuses_the_rest(
    fresh_cluster: ControlPlane,
) -> None:
    options = mcr.ClusterOptions(
        health_probe_interval=3600.0, health_credential_interval=3600.0, backoff=_NO_RETRY_SOON
    )
    async with mcr.Cluster("trial", _config(fresh_cluster), options) as cluster:
        await wait_until(lambda: cluster.health.healthy, timeout=30)
        await cluster.client.get(mcr.Kind("v1", "Namespace"), "default")  # discovery known: one request each
        health = cluster.transport.health
        with hung(fresh_cluster):
            health.suspect()
            await _until_trial_ready(cluster)
            trial = asyncio.create_task(cluster.client.get(mcr.Kind("v1", "Namespace"), "default"))
            await wait_until(lambda: not health.trial_ready)  # the trial is out, waiting on the server
            with pytest.raises(mcr.Unreachable, match="not sending GET"):
                await cluster.client.get(mcr.Kind("v1", "Namespace"), "kube-system")
            with pytest.raises(mcr.Unreachable, match="a trial through the open circuit"):
                await trial  # no answer within the probe's timeout: the circuit stays open
            assert health.unreachable
        await _until_trial_ready(cluster)
        assert await cluster.client.get(mcr.Kind("v1", "Namespace"), "kube-system") is not None
        assert not health.unreachable


async def test_a_hung_server_opens_every_circuit_of_it_and_one_answer_closes_them(
    fresh_cluster: ControlPlane,
) -> None:
    """Clusters of one server: one probe finds it hung for all; a write of any one of them reopens all."""
    plane = fresh_cluster
    users = [plane.add_token_user(unique("member")) for _ in range(4)]
    options = mcr.ClusterOptions(health_probe_interval=3600.0, health_credential_interval=3600.0)
    async with AsyncExitStack() as stack:
        clusters = [
            await stack.enter_async_context(mcr.Cluster(f"member-{i}", _config(plane, user), options))
            for i, user in enumerate(users)
        ]
        await wait_until(lambda: all(cluster.health.healthy for cluster in clusters), timeout=30)
        before = {cluster.name: cluster.transport.health.probes for cluster in clusters}
        with hung(plane):
            clusters[-1].transport.health.suspect()
            await wait_until(lambda: all(cluster.health.unreachable for cluster in clusters), timeout=30)
            for cluster in clusters[:-1]:
                if cluster.transport.health is not _server(cluster).lead:
                    assert cluster.transport.health.probes == before[cluster.name], cluster.name
            await _until_trial_ready(clusters[1])
        await clusters[1].client.create(configmap(unique("reopened"), "default"))
        assert not any(cluster.health.unreachable for cluster in clusters)
        assert all(cluster.health.healthy for cluster in clusters)


async def test_suspicion_during_an_outage_costs_no_probe_but_the_leads(fresh_cluster: ControlPlane) -> None:
    """During a server outage only the lead probes, however many members' requests failed."""
    plane = fresh_cluster
    users = [plane.add_token_user(unique("quiet")) for _ in range(3)]
    options = mcr.ClusterOptions(health_probe_interval=3600.0, health_credential_interval=3600.0)
    async with AsyncExitStack() as stack:
        clusters = [
            await stack.enter_async_context(mcr.Cluster(f"quiet-{i}", _config(plane, user), options))
            for i, user in enumerate(users)
        ]
        await wait_until(lambda: all(cluster.health.healthy for cluster in clusters), timeout=30)
        lead = _server(clusters[0]).lead
        leader = next(cluster for cluster in clusters if cluster.transport.health is lead)
        others = [cluster for cluster in clusters if cluster is not leader]
        with hung(plane):
            leader.transport.health.suspect()
            await wait_until(lambda: all(cluster.health.unreachable for cluster in clusters), timeout=30)
            counts = [cluster.transport.health.probes for cluster in others]
            for cluster in others:
                cluster.transport.health.suspect()
            probes = leader.transport.health.probes
            await wait_until(lambda: leader.transport.health.probes >= probes + 2, timeout=60)
            assert [cluster.transport.health.probes for cluster in others] == counts
        await wait_until(lambda: all(cluster.health.healthy for cluster in clusters), timeout=60)


async def test_a_cold_start_of_many_clusters_of_one_server_sends_one_probe_not_one_each(
    fresh_cluster: ControlPlane,
) -> None:
    """Their first requests vouch for them: only the lead's probe asks the server."""
    options = mcr.ClusterOptions(health_probe_interval=3600.0, health_credential_interval=3600.0)
    async with AsyncExitStack() as stack:
        clusters = [
            await stack.enter_async_context(mcr.Cluster(f"cold-{i}", _config(fresh_cluster), options))
            for i in range(20)
        ]
        await asyncio.gather(*(cluster.client.list(CONFIGMAP, namespace="default") for cluster in clusters))
        await wait_until(lambda: all(cluster.health.healthy for cluster in clusters), timeout=30)
        probes = [cluster.transport.health.probes for cluster in clusters]
        print(f"probes at a cold start of {len(clusters)} clusters of one server: {sum(probes)}")
        lead = _server(clusters[0]).lead
        assert lead is not None and lead.probes == 1  # the lead's, for the server
        assert sum(probes) < len(clusters), probes


async def test_a_probe_timeout_fired_late_by_our_own_loop_blames_no_server(
    fresh_cluster: ControlPlane,
) -> None:
    """A saturated event loop hears nothing in time: that is no verdict on the server."""
    options = mcr.ClusterOptions(health_probe_interval=3600.0, health_credential_interval=3600.0)
    async with mcr.Cluster("late-loop", _config(fresh_cluster), options) as cluster:
        await wait_until(lambda: cluster.health.healthy, timeout=30)
        transport = cluster.transport
        with hung(fresh_cluster):
            # On time: a hung server's silence is the server's, also past aiohttp's rounding of
            # timeouts over 5 s up to a whole second of the loop's clock.
            for timeout in (0.3, 5.5):
                verdict = await transport.probe(timeout)
                assert verdict is not None and verdict[1], verdict
                assert verdict[0].startswith(f"no answer to GET /version in {timeout:g}s"), verdict
            # Late: the probe is in flight, then the loop is blocked past its deadline.
            probing = asyncio.create_task(transport.probe(0.3))
            await wait_until(lambda: bool(transport._waiting), interval=0.001)
            time.sleep(1.0)  # noqa: ASYNC251 - the stimulus: this event loop blocked, as by a cold start
            with pytest.raises(ProbeInconclusive, match=r"event loop ran \S+ late"):
                await probing
        assert cluster.health.healthy, "a late loop must not have marked the cluster unhealthy"


async def test_inconclusive_probes_give_no_verdict_until_a_run_of_them_counts() -> None:
    """Late probes leave the cluster as it was; only a run of them in a row counts as a failure."""
    record = HealthRecord("busy")
    late = ProbeInconclusive("no answer in time, but the event loop ran late")
    answers: list[ProbeResult | ProbeInconclusive] = [late, late, None, *[late] * _INCONCLUSIVE_LIMIT]
    seen: list[HealthState] = []  # the cluster's state as each probe starts
    hang = asyncio.Event()

    async def probe(_timeout: float) -> ProbeResult:
        seen.append(record.state)
        if not answers:
            await hang.wait()  # the sequence is over: no more probes end
        answer = answers.pop(0)
        if isinstance(answer, ProbeInconclusive):
            raise answer
        return answer

    task = asyncio.create_task(
        record.probe_forever(probe, interval=0.05, timeout=0.05, backoff=mcr.Backoff(base=0.01, cap=0.01))
    )
    try:
        await wait_until(lambda: len(seen) == 4 + _INCONCLUSIVE_LIMIT, what="every scripted probe")
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    unknown, healthy = HealthState.UNKNOWN, HealthState.HEALTHY
    assert seen == [unknown] * 3 + [healthy] * _INCONCLUSIVE_LIMIT + [HealthState.UNHEALTHY]
    assert record.inconclusive == 2 + _INCONCLUSIVE_LIMIT - 1
    assert record.unreachable and "event loop ran late" in (record.reason or "")


@asynccontextmanager
async def _lead_and_member(
    answer: ProbeResult, interval: float
) -> AsyncIterator[tuple[HealthRecord, HealthRecord, dict[str, int]]]:
    """Two probe loops on one scripted server, each probe answering ``answer``; probes counted by name."""
    server = ServerLiveness("scripted server")
    lead, member = HealthRecord("lead"), HealthRecord("member")
    probed: dict[str, int] = {"lead": 0, "member": 0}

    def script(name: str) -> Callable[[float], Awaitable[ProbeResult]]:
        async def probe(_timeout: float) -> ProbeResult:
            probed[name] += 1
            return answer

        return probe

    tasks = [
        asyncio.create_task(
            record.probe_forever(
                script(record.cluster), interval=interval, timeout=1.0, backoff=_NO_RETRY_SOON, server=server
            )
        )
        for record in (lead, member)
    ]
    try:
        yield lead, member, probed
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def test_a_server_that_answers_again_does_not_probe_its_unvouched_members_at_once() -> None:
    """Members never vouched for when an outage began are judged as at a cold start: a request vouches.

    A server's thousand unvouched members would otherwise all probe the
    moment it answers again (the storm that S12 showed at 10,000 clusters).
    """
    silent: ProbeResult = ("no answer to GET /version in 1s", True, True)
    async with _lead_and_member(silent, interval=3600.0) as (lead, member, probed):
        await wait_until(lambda: lead.unreachable and member.unreachable, what="the outage")
        await wait_until(lambda: probed["member"] == 1, what="the member's one probe in the outage")
        assert member.state is HealthState.UNHEALTHY
        lead.contact(200)  # the server answered the lead again: every member's circuit closes
        assert not member.unreachable
        member.contact(200)  # the member's own first request after it: this vouches for it
        await wait_until(lambda: member.state is HealthState.HEALTHY, what="the member vouched for")
        assert probed["member"] == 1  # healthy by its request, not by a probe of its own


async def test_a_member_whose_own_request_is_on_its_way_is_not_probed_for_it() -> None:
    """A cold start of thousands queues its first requests for turns: their answers vouch, not probes."""
    grace = 0.05  # the member's first check is due this long after it joined, unless vouched for
    async with _lead_and_member(None, interval=grace) as (lead, member, probed):
        on_its_way = [True]
        member.outstanding = lambda: on_its_way[0]
        await wait_until(lambda: lead.state is HealthState.HEALTHY, what="the lead's probe")
        await asyncio.sleep(20 * grace)  # the window itself: twenty graces in which no probe may go
        assert probed["member"] == 0 and member.state is HealthState.UNKNOWN
        on_its_way[0] = False  # its request ended without vouching (a 401, say): now it is checked
        await wait_until(lambda: probed["member"] == 1, what="the member's first check")
        await wait_until(lambda: member.state is HealthState.HEALTHY, what="its verdict")


async def test_a_probe_unanswered_while_the_server_answers_others_blames_no_server() -> None:
    """Busy is not silent: no verdict while other requests to the server get answers."""
    server = ServerLiveness("scripted server")
    record = HealthRecord("busy-lead")
    silent: ProbeResult = ("no answer to GET /version in 4s", True, True)
    answered_meanwhile = [True, False]  # the first probe waits while others are answered; the next does not

    async def probe(_timeout: float) -> ProbeResult:
        if answered_meanwhile and answered_meanwhile.pop(0):
            server.heard()  # another cluster's request to the same server got its answer
        return silent

    task = asyncio.create_task(
        record.probe_forever(probe, interval=0.05, timeout=0.05, backoff=_NO_RETRY_SOON, server=server)
    )
    try:
        await wait_until(lambda: record.probes == 2, what="the second probe")
        await wait_until(lambda: record.state is HealthState.UNHEALTHY, what="the second probe's verdict")
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert record.inconclusive == 1  # the first: no verdict, the server was busy answering others
    assert record.unreachable and server.outage is not None  # the second: nobody heard anything
