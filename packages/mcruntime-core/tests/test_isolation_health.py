"""Health with one source of truth, and a fail-fast circuit, on real control planes.

A hung server (SIGSTOP: the socket accepts, nothing answers) and a revoked token
must show in ``statuses()``, ``/readyz`` and ``mcruntime_cluster_healthy`` alike,
within the probe's timeout plus one interval, with a message that says what
failed; requests to a hung server fail at once instead of holding a worker.
"""

from __future__ import annotations

import asyncio
import re
import time

import aiohttp
import pytest
from kube_helpers import CONFIGMAP, configmap, hung, running_cluster, unique

import mcruntime as mcr
from mcruntime._base.backoff import Backoff
from mcruntime._client.health import HealthRecord
from mcruntime._client.transport import Transport
from mcruntime.cache import Informer
from mcruntime.client import HealthState
from mcruntime.testing import ControlPlane, Fleet, running, wait_until

# When the suite runs in parallel, no other test runs beside this module's:
# it times how soon a hang or a revoked token is seen.
pytestmark = pytest.mark.alone

# The defaults under test: a probe every 5 s with a 4 s timeout, so a hung server is seen
# within their sum. The tests assert how it is seen (by the probe, its message names the
# probe's timeout) and print how long it took; a deadline a few times the bound only keeps a
# broken build from waiting forever, since two shared cores cannot promise wall-clock figures.
PROBE_TIMEOUT = mcr.ClusterOptions().health_probe_timeout
DETECTION_BOUND = mcr.ClusterOptions().health_probe_interval + PROBE_TIMEOUT
DEADLINE = 6 * DETECTION_BOUND


def config_of(plane: ControlPlane, user: object = None) -> mcr.ClusterConfig:
    return mcr.kubeconfig_from_dict(plane.kubeconfig(user))  # type: ignore[arg-type]


async def _get(url: str) -> tuple[int, str]:
    async with aiohttp.ClientSession() as session, session.get(url) as response:
        return response.status, await response.text()


async def _readyz_line(manager: mcr.Manager, name: str) -> str:
    _status, body = await _get(manager.endpoints.url("/readyz") + "?verbose")
    for line in body.splitlines():
        if line.startswith((f"[+]cluster:{name} ", f"[-]cluster:{name} ")):
            return line
    return ""


async def _ready_in_readyz(manager: mcr.Manager, name: str) -> bool:
    """Whether ``name``'s line passes: healthy and its caches synced, not merely listed."""
    return (await _readyz_line(manager, name)).startswith(f"[+]cluster:{name} ok")


async def _healthy_metric(manager: mcr.Manager, name: str) -> float | None:
    _status, body = await _get(manager.endpoints.url("/metrics"))
    found = re.search(rf'^mcruntime_cluster_healthy{{cluster="{name}"}} (\S+)$', body, re.MULTILINE)
    return float(found.group(1)) if found else None


def _state(provider: mcr.StaticProvider, name: str) -> mcr.ClusterPhase | None:
    status = provider.statuses().get(name)
    return status.phase if status is not None else None


async def _nothing(_request: mcr.Request) -> None:
    return None


async def test_a_hung_server_is_unhealthy_everywhere_as_its_probe_finds_it(
    fleet: Fleet, fresh_cluster: ControlPlane
) -> None:
    provider = mcr.StaticProvider({"up": config_of(fleet["cluster-1"]), "hung": config_of(fresh_cluster)})
    manager = mcr.Manager(
        provider, health_probe_address="127.0.0.1:0", metrics_address="127.0.0.1:0", handle_signals=False
    )
    mcr.controller_managed_by(manager).for_(CONFIGMAP).complete(_nothing)
    async with running(manager):
        await wait_until(lambda: provider.statuses().get("hung") is not None)
        await wait_until(lambda: provider.statuses()["hung"].phase is mcr.ClusterPhase.READY, timeout=30)
        # Ready everywhere before the hang, caches included: a probe's answer comes before the
        # informer's first list does, and a list caught by the hang is retried after it.
        await wait_until(lambda: _ready_in_readyz(manager, "hung"), timeout=30)
        await wait_until(lambda: _ready_in_readyz(manager, "up"), timeout=30)
        with hung(fresh_cluster):
            stopped = time.monotonic()
            await wait_until(
                lambda: provider.statuses()["hung"].phase is mcr.ClusterPhase.UNHEALTHY,
                timeout=DEADLINE,
            )
            detected = time.monotonic() - stopped
            status = provider.statuses()["hung"]
            assert status.error == f"no answer to GET /version in {PROBE_TIMEOUT:g}s", status
            # Every view reads the same record, so they agree at once.
            assert await _readyz_line(manager, "hung") == (
                f"[-]cluster:hung failed: unhealthy: no answer to GET /version in {PROBE_TIMEOUT:g}s"
            )
            assert await _healthy_metric(manager, "hung") == 0.0
            assert manager.clusters()["hung"].health.unreachable
            assert (await _readyz_line(manager, "up")).startswith("[+]cluster:up ok")
            assert await _healthy_metric(manager, "up") == 1.0
            # Detected by the probe's own timeout (the error says so), not by a request's 30 s.
            print(f"hung server reported unhealthy after {detected:.1f}s (bound {DETECTION_BOUND:.0f}s)")
        resumed = time.monotonic()
        await wait_until(lambda: provider.statuses()["hung"].phase is mcr.ClusterPhase.READY, timeout=30)
        recovered = time.monotonic() - resumed
        print(f"resumed server reported healthy after {recovered:.1f}s")
        # The health record answers first; /readyz passes once the informers, woken by that
        # answer, have listed again (a watch the hang broke resumes or relists).
        await wait_until(lambda: _ready_in_readyz(manager, "hung"), timeout=30)
        assert await _healthy_metric(manager, "hung") == 1.0


async def test_requests_to_a_hung_server_fail_fast_and_waiting_ones_are_interrupted(
    fresh_cluster: ControlPlane,
) -> None:
    async with running_cluster(fresh_cluster) as cluster:
        await wait_until(lambda: cluster.health.healthy, timeout=30)
        with hung(fresh_cluster):
            waiting = asyncio.create_task(cluster.client.get(CONFIGMAP, "anything", namespace="default"))
            # Interrupted by the probe's verdict (its message), where without the circuit this
            # GET would wait out 5 attempts of the 30 s request timeout.
            with pytest.raises(mcr.Unreachable, match="no answer to GET /version in"):
                await waiting
            # And the next one is refused before it is sent.
            with pytest.raises(mcr.Unreachable, match="not sending GET"):
                await cluster.client.get(CONFIGMAP, "anything", namespace="default")
        await wait_until(lambda: cluster.health.healthy, timeout=30)
        assert await cluster.client.get(mcr.Kind("v1", "Namespace"), "default") is not None


async def test_a_revoked_token_is_unhealthy_in_readyz_naming_the_401_and_a_new_token_recovers(
    fresh_cluster: ControlPlane,
) -> None:
    account = unique("revoked")
    user = fresh_cluster.add_token_user(account)
    # An idle cluster's credential is checked every health_credential_interval (300 s by
    # default); the promise under test is for a cluster checked as often as its server.
    options = mcr.ClusterOptions(health_credential_interval=mcr.ClusterOptions().health_probe_interval)
    provider = mcr.StaticProvider({"member": config_of(fresh_cluster, user)}, options=options)
    manager = mcr.Manager(provider, health_probe_address="127.0.0.1:0", handle_signals=False)
    mcr.controller_managed_by(manager).for_(CONFIGMAP).complete(_nothing)
    async with running(manager):
        await wait_until(lambda: _readyz_line(manager, "member"), timeout=30)
        await wait_until(lambda: _state(provider, "member") is mcr.ClusterPhase.READY, timeout=30)
        fresh_cluster.revoke_token_user(account)
        # The apiserver keeps accepting a revoked token from its authentication cache
        # for a few seconds; measure from the first 401 an independent client sees.
        first_401 = await _first_401(fresh_cluster, user)
        await wait_until(
            lambda: provider.statuses()["member"].phase is mcr.ClusterPhase.UNHEALTHY,
            timeout=DEADLINE,
        )
        detected = time.monotonic() - first_401
        print(f"revoked token reported unhealthy {detected:.1f}s after the server began refusing it")
        assert (
            provider.statuses()["member"].error
            == "credentials rejected: GET /version answered 401 Unauthorized"
        )
        assert await _readyz_line(manager, "member") == (
            "[-]cluster:member failed: unhealthy: credentials rejected: GET /version answered 401 Unauthorized"
        )
        # A new token (a new ServiceAccount of the same name) is swapped in place and recovers.
        renewed = fresh_cluster.add_token_user(account)
        await provider.set("member", config_of(fresh_cluster, renewed))
        await wait_until(lambda: provider.statuses()["member"].phase is mcr.ClusterPhase.READY, timeout=30)
        assert provider.statuses()["member"].credential_rotations == 1


async def _first_401(plane: ControlPlane, user: object) -> float:
    async with mcr.Cluster("observer", config_of(plane, user)) as observer:
        while True:
            status, _headers, _body = await observer.transport.request("GET", "/version")
            if status == 401:
                return time.monotonic()
            await asyncio.sleep(0.1)


async def test_an_informer_survives_5000_consecutive_failures_at_its_capped_delay(
    fresh_cluster: ControlPlane,
) -> None:
    chosen: list[float] = []

    class Recording(Backoff):
        def delay(self, failures: int) -> float:
            chosen.append(Backoff().delay(failures))
            return 0.0

    options = mcr.ClusterOptions(retry=mcr.RetryPolicy(attempts=1), health_probe_interval=3600.0)
    async with running_cluster(fresh_cluster, options=options) as cluster:
        await wait_until(lambda: cluster.health.healthy, timeout=30)
        await fresh_cluster.stop_async()  # every list now fails: connection refused
        informer = Informer(cluster.client, CONFIGMAP, namespace="default", backoff=Recording())
        task = asyncio.create_task(informer.run())
        try:
            await wait_until(lambda: len(chosen) >= 5000, timeout=120)
            assert not task.done(), "the informer's loop died"
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await fresh_cluster.start_async()
    cap = Backoff().cap
    assert max(chosen) <= cap and min(chosen[-1000:]) >= cap / 2  # at its cap, jittered
    assert "cannot connect" in (informer.stats.last_error or "")


async def test_a_health_probe_survives_5000_consecutive_failures_at_its_capped_delay() -> None:
    record = HealthRecord("nowhere")
    waits: list[float] = []

    class Recording(Backoff):
        def delay(self, failures: int) -> float:
            waits.append(Backoff(base=0.5, cap=5.0).delay(failures))
            return 0.0

    async def failing_probe(_timeout: float) -> tuple[str, bool]:
        return "GET /version failed: cannot connect: Connection refused", True

    task = asyncio.create_task(
        record.probe_forever(failing_probe, interval=5.0, timeout=5.0, backoff=Recording())
    )
    try:
        await wait_until(lambda: len(waits) >= 5000, timeout=60)
        assert not task.done(), "the probe loop died"
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert record.snapshot().state is HealthState.UNHEALTHY and record.unreachable
    assert max(waits) <= 5.0 and min(waits[-100:]) >= 2.5


async def test_a_set_cancelled_halfway_still_replaces_and_starts_the_cluster(fleet: Fleet) -> None:
    provider = mcr.StaticProvider({"member": config_of(fleet["cluster-1"])})
    manager = mcr.Manager(provider, handle_signals=False)
    async with running(manager):
        old = await provider.clusters.wait_engaged("member")
        change = asyncio.create_task(provider.set("member", config_of(fleet["cluster-2"])))
        await asyncio.sleep(0)  # let the update register the replacement, then cancel its caller
        change.cancel()
        await asyncio.gather(change, return_exceptions=True)
        await wait_until(lambda: manager.clusters().get("member") not in (None, old), timeout=30)
        new = manager.clusters()["member"]
        assert old.stopped and not new.stopped and new.config.server == fleet["cluster-2"].server
        await wait_until(lambda: new.health.healthy, timeout=30)
        ns = unique("cancelled")
        await new.client.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
        assert await new.client.create(configmap("x", ns)) is not None


async def test_a_circuit_opening_again_before_an_interrupted_request_ends_interrupts_the_others(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """S12 at 10,000 clusters: circuits flapped and each later opening raised, leaving requests waiting."""
    config = mcr.kubeconfig_from_dict(
        {
            "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:9"}}],
            "users": [{"name": "u", "user": {"token": "t"}}],
            "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
            "current-context": "x",
        }
    )
    transport = Transport(config, "flapping")
    entered: list[asyncio.Timeout] = []
    cleaned_up = asyncio.Event()

    async def waiting_on_the_server() -> None:  # what a request does while it waits for an answer
        async with asyncio.timeout(None) as waiting:
            transport._waiting.add(waiting)
            entered.append(waiting)
            try:
                try:
                    await asyncio.Event().wait()
                except asyncio.CancelledError:
                    await cleaned_up.wait()  # cleanup that awaits (a connection closing, say)
                    raise
            finally:
                transport._waiting.discard(waiting)

    first = asyncio.create_task(waiting_on_the_server())
    await wait_until(lambda: len(entered) == 1, timeout=5)
    transport.health.unhealthy("first outage", unreachable=True)  # interrupts the first request
    await wait_until(entered[0].expired, timeout=5)  # which is still cleaning up, so still waiting
    second = asyncio.create_task(waiting_on_the_server())
    await wait_until(lambda: len(entered) == 2, timeout=5)
    transport.health.contact(200)  # the server answered: the circuit closes
    transport.health.unhealthy("second outage", unreachable=True)  # and opens again
    cleaned_up.set()
    done, pending = await asyncio.wait({first, second}, timeout=60)  # a guard, not a measurement
    assert not pending, "a request the second opening should have interrupted is still waiting"
    assert all(isinstance(task.exception(), TimeoutError) for task in done)
    assert not [record for record in caplog.records if "circuit listener failed" in record.getMessage()]
    await transport.close()


async def test_a_probe_interrupted_by_another_probes_verdict_says_what_failed_once(
    fresh_cluster: ControlPlane,
) -> None:
    """A hub down read 'GET /version failed: GET /version failed: cannot connect ...'.

    Another cluster of the same server found it refusing connections; its verdict
    opened this cluster's circuit and interrupted this cluster's probe, whose
    error then put its own prefix before the verdict's, which has one already.
    """
    transport = Transport(config_of(fresh_cluster), "interrupted")
    try:
        with hung(fresh_cluster):  # this probe waits for an answer
            probing = asyncio.create_task(transport.probe(60.0))
            await wait_until(
                lambda: transport.health.outstanding is not None and transport.health.outstanding()
            )
            verdict = (
                "GET /version failed: cannot connect: Connection refused"  # a sibling's probe, as worded
            )
            transport.health.server_outage(verdict)
            result = await asyncio.wait_for(probing, timeout=30)  # a guard: it is interrupted at once
        assert result is not None
        assert result[0] == f"{verdict}; the request was interrupted", result
        assert result[1] is True  # no answer: this cluster's circuit stays open
    finally:
        await transport.close()
