"""Running in production: leader election, probes, metrics, events, logs and settings."""

from __future__ import annotations

import asyncio
import base64
import logging
import re
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import aiohttp
import pytest
from kube_helpers import CONFIGMAP, configmap, unique
from leader_process import stamping_manager

import mcruntime as mcr
from mcruntime.log import JSONFormatter, ReconcileContextFilter
from mcruntime.testing import ControlPlane, Fleet, running, wait_until
from mcruntime.workqueue import ExponentialBackoff

LEASE = mcr.Kind("coordination.k8s.io/v1", "Lease")
EVENT = mcr.Kind("events.k8s.io/v1", "Event")


def config_of(plane: ControlPlane, user: object = None) -> mcr.ClusterConfig:
    return mcr.kubeconfig_from_dict(plane.kubeconfig(user))  # type: ignore[arg-type]


async def _namespace(plane: ControlPlane, prefix: str, objects: list[str] = ()) -> str:  # type: ignore[assignment]
    namespace = unique(prefix)
    async with mcr.Cluster("setup", config_of(plane)) as cluster:
        await cluster.client.create(
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}
        )
        for name in objects:
            await cluster.client.create(configmap(name, namespace, v="1"))
    return namespace


async def _get(url: str) -> tuple[int, str]:
    async with aiohttp.ClientSession() as session, session.get(url) as response:
        return response.status, await response.text()


# --- leader election ---------------------------------------------------------------------


def _stamping_manager(
    plane: ControlPlane, namespace: str, lease: str, identity: str, lease_duration: float = 4
) -> mcr.Manager:
    return stamping_manager(
        config_of(plane), namespace, lease, identity, handle_signals=False, lease_duration=lease_duration
    )


async def _stamps(plane: ControlPlane, namespace: str) -> Counter[str]:
    async with mcr.Cluster("reader", config_of(plane)) as cluster:
        listed = await cluster.client.list(CONFIGMAP, namespace=namespace)
    return Counter(
        (item["metadata"].get("annotations") or {}).get("reconciled-by", "") for item in listed.items
    )


async def _holder(plane: ControlPlane, namespace: str, lease: str) -> str:
    async with mcr.Cluster("reader", config_of(plane)) as cluster:
        try:
            found = await cluster.client.get(LEASE, lease, namespace=namespace)
        except mcr.NotFound:
            return ""
    return str((found.get("spec") or {}).get("holderIdentity") or "")


async def test_only_the_leader_reconciles_and_a_graceful_stop_hands_over_at_once(fleet: Fleet) -> None:
    plane = fleet["cluster-1"]
    namespace = await _namespace(plane, "leader", ["a", "b"])
    first = _stamping_manager(plane, namespace, "ctl", "first")
    # The standby judges expiry by its own lease duration: at 600 s, only a released Lease
    # can be taken while this test runs, so taking it at all shows the handover was at once.
    second = _stamping_manager(plane, namespace, "ctl", "second", lease_duration=600)
    async with running(first):
        assert first.elector is not None
        await asyncio.wait_for(first.elector.leading.wait(), 15)
        async with running(second):
            await wait_until(lambda: _count(_stamps(plane, namespace), "first", 2))
            async with mcr.Cluster("writer", config_of(plane)) as writer:
                await writer.client.create(configmap("c", namespace, v="1"))
            await wait_until(lambda: _count(_stamps(plane, namespace), "first", 3))
            assert (await _stamps(plane, namespace))["second"] == 0
            assert second.elector is not None and not second.elector.leading.is_set()
            # Graceful stop of the leader: the lease is released, the standby takes over at once.
            first.stop()
            await asyncio.wait_for(second.elector.leading.wait(), 60)
            async with mcr.Cluster("writer", config_of(plane)) as writer:
                await writer.client.create(configmap("d", namespace, v="1"))
            await wait_until(lambda: _count(_stamps(plane, namespace), "second", 1))


async def test_leader_election_master_status_reads_1_on_the_leader_and_follows_a_handover(
    fleet: Fleet,
) -> None:
    plane = fleet["cluster-1"]
    namespace = await _namespace(plane, "leader-status")
    first = _stamping_manager(plane, namespace, "status", "first")
    second = _stamping_manager(plane, namespace, "status", "second", lease_duration=600)

    def status(manager: mcr.Manager) -> float | None:
        # controller-runtime's name and label: existing dashboards and alerts work unchanged.
        return manager.registry.get_sample_value("leader_election_master_status", {"name": "status"})

    async with running(first):
        assert first.elector is not None
        await asyncio.wait_for(first.elector.leading.wait(), 15)
        assert status(first) == 1
        async with running(second):
            assert second.elector is not None
            await wait_until(lambda: second.elector is not None and second.elector.observed_holder == "first")
            assert status(second) == 0
            first.stop()
            await asyncio.wait_for(second.elector.leading.wait(), 60)
            assert status(second) == 1
            await wait_until(lambda: status(first) == 0)


async def _count(stamps: object, identity: str, at_least: int) -> bool:
    found = await stamps  # type: ignore[misc]
    return bool(found[identity] >= at_least)


async def test_a_crashed_leader_is_replaced_once_its_lease_expires(fleet: Fleet, tmp_path: Path) -> None:
    plane = fleet["cluster-2"]
    namespace = await _namespace(plane, "crash", ["a"])
    script = Path(__file__).with_name("leader_process.py")
    process = subprocess.Popen(  # noqa: ASYNC220 -- a child that outlives this statement
        [sys.executable, str(script), str(plane.kubeconfig_path()), namespace, "ctl", "doomed"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        await wait_until(lambda: _count(_stamps(plane, namespace), "doomed", 1), timeout=60)
        assert await _holder(plane, namespace, "ctl") == "doomed"
        survivor = _stamping_manager(plane, namespace, "ctl", "survivor")
        async with running(survivor):
            elector = survivor.elector
            assert elector is not None
            await wait_until(
                lambda: elector.observed_holder == "doomed", what="the survivor saw the live lease"
            )
            assert not elector.leading.is_set()
            process.send_signal(signal.SIGKILL)
            await asyncio.wait_for(elector.leading.wait(), 60)
            assert await _holder(plane, namespace, "ctl") == "survivor"
            async with mcr.Cluster("writer", config_of(plane)) as writer:
                await writer.client.create(configmap("after", namespace, v="1"))
            await wait_until(lambda: _count(_stamps(plane, namespace), "survivor", 1))
    finally:
        process.kill()
        process.wait()


# --- probes ----------------------------------------------------------------------------------


async def test_readyz_waits_for_caches_and_names_an_unreachable_cluster(
    fleet: Fleet, fresh_cluster: ControlPlane
) -> None:
    await fresh_cluster.stop_async()
    options = mcr.ClusterOptions(retry=mcr.RetryPolicy(attempts=1), cache_sync_timeout=60)
    provider = mcr.StaticProvider(
        {"up": config_of(fleet["cluster-1"]), "down": config_of(fresh_cluster)},
        options=options,
        probe_interval=0.5,
    )
    manager = mcr.Manager(provider, health_probe_address="127.0.0.1:0", handle_signals=False)
    mcr.controller_managed_by(manager).for_(CONFIGMAP).complete(_nothing)
    async with running(manager):
        healthz = manager.endpoints.url("/healthz")
        readyz = manager.endpoints.url("/readyz")
        assert await _get(healthz) == (200, "ok")
        await wait_until(lambda: provider.statuses().get("down") is not None)
        status, body = await _get(readyz + "?verbose")
        assert status == 500
        assert re.search(r"^\[-\]cluster:down failed: ", body, re.MULTILINE), body
        await wait_until(lambda: _line_ok(readyz, "cluster:up"))
        await fresh_cluster.start_async()
        await wait_until(lambda: _ready(readyz), timeout=60)
        status, body = await _get(readyz + "?verbose")
        assert status == 200 and "[+]cluster:down ok" in body and "[+]cluster:up ok" in body


async def test_readyz_fails_before_the_start_is_done_and_once_the_manager_stops(fleet: Fleet) -> None:
    """The endpoints serve from the start's first step; a replica on its way out takes no new work."""
    namespace = await _namespace(fleet["cluster-1"], "readyz", ["held"])
    manager = mcr.Manager(
        local=config_of(fleet["cluster-1"]), health_probe_address="127.0.0.1:0", handle_signals=False
    )
    entered, release = asyncio.Event(), asyncio.Event()

    async def held(_request: mcr.Request) -> None:
        entered.set()
        await release.wait()

    mcr.controller_managed_by(manager).named("held").for_(CONFIGMAP, namespace=namespace).complete(held)
    before = {name: problem for name, problem, _counts in await manager._readyz.evaluate()}
    assert before["manager"] == "starting: the hub cluster and the provider are not up yet"
    task = asyncio.create_task(manager.start())
    try:
        await manager.wait_started()
        readyz = manager.endpoints.url("/readyz")
        await wait_until(lambda: _ready(readyz), timeout=60)
        await asyncio.wait_for(entered.wait(), 60)  # the ConfigMap's reconcile, which holds
        manager.stop()  # the drain waits for that reconcile: the endpoints still serve meanwhile
        status, body = await _get(readyz + "?verbose")
        assert status == 500 and "[-]manager failed: shutting down" in body, body
    finally:
        release.set()
        await asyncio.wait_for(task, 60)


async def _line_ok(url: str, name: str) -> bool:
    _status, body = await _get(url + "?verbose")
    return f"[+]{name} ok" in body


async def _ready(url: str) -> bool:
    status, _body = await _get(url)
    return status == 200


async def _nothing(_request: mcr.Request) -> None:
    return None


async def test_user_checks_show_in_healthz(fleet: Fleet) -> None:
    manager = mcr.Manager(
        local=config_of(fleet["cluster-1"]), health_probe_address="127.0.0.1:0", handle_signals=False
    )
    manager.add_healthz_check("database", lambda: "connection refused")
    async with running(manager):
        status, body = await _get(manager.endpoints.url("/healthz") + "?verbose")
    assert status == 500
    assert "[+]ping ok" in body and "[-]database failed: connection refused" in body


# --- metrics ---------------------------------------------------------------------------------


def _sample(text: str, name: str, **labels: str) -> float:
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        if all(f'{key}="{value}"' in line for key, value in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


async def test_metrics_count_reconciles_per_cluster_and_follow_the_fleet(fleet: Fleet) -> None:
    east, west = fleet["cluster-1"], fleet["cluster-2"]
    namespace = await _namespace(east, "metrics", ["a", "b", "c"])
    async with mcr.Cluster("setup", config_of(west)) as cluster:
        await cluster.client.create(
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}
        )
        await cluster.client.create(configmap("only", namespace, v="1"))
    provider = mcr.StaticProvider({"east": config_of(east), "west": config_of(west)}, probe_interval=0.5)
    manager = mcr.Manager(provider, metrics_address="127.0.0.1:0", handle_signals=False)
    seen: Counter[str] = Counter()

    async def count(request: mcr.Request) -> None:
        seen[request.cluster] += 1

    mcr.controller_managed_by(manager).named("counter").for_(CONFIGMAP, namespace=namespace).complete(count)
    async with running(manager):
        url = manager.endpoints.url("/metrics")

        async def settled() -> bool:
            _status, text = await _get(url)
            return (
                seen["east"] == 3
                and seen["west"] == 1
                and all(
                    _sample(
                        text,
                        "controller_runtime_reconcile_total",
                        controller="counter",
                        cluster=name,
                        result="success",
                    )
                    == seen[name]
                    for name in ("east", "west")
                )
                and _sample(text, "mcruntime_engaged_clusters", state="ready") == 2
            )

        await wait_until(settled)
        _status, text = await _get(url)
        assert _sample(text, "workqueue_adds_total", controller="counter", cluster="east") >= 3
        assert "controller_runtime_reconcile_time_seconds_bucket" in text
        assert _sample(text, "mcruntime_cache_sync_duration_seconds", cluster="east") > 0
        # An empty queue is a depth of 0, as controller-runtime exports it, not a missing series.
        for name in ("east", "west"):
            assert f'workqueue_depth{{cluster="{name}",controller="counter",name="counter"}} 0.0' in text, (
                text
            )
        await provider.remove("west")

        async def one_left() -> bool:
            _status, body = await _get(url)
            # Every series of a departed cluster is removed, not only its live gauges.
            return (
                _sample(body, "mcruntime_engaged_clusters", state="ready") == 1
                and 'cluster="west"' not in body
            )

        await wait_until(one_left)
        _status, text = await _get(url)
        assert _sample(text, "mcruntime_cluster_disengagements_total") == 1
        assert _sample(text, "controller_runtime_reconcile_total", cluster="east") == seen["east"]


# --- events ----------------------------------------------------------------------------------


async def test_an_event_lands_in_the_requests_cluster_only_and_repeats_aggregate(fleet: Fleet) -> None:
    east, west = fleet["cluster-1"], fleet["cluster-3"]
    namespace = await _namespace(east, "events", ["target"])
    async with mcr.Cluster("setup", config_of(west)) as cluster:
        await cluster.client.create(
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}
        )
    provider = mcr.StaticProvider({"east": config_of(east), "west": config_of(west)})
    manager = mcr.Manager(provider, handle_signals=False)
    recorder = manager.event_recorder("eventful")
    recorded = asyncio.Event()

    async def record(request: mcr.Request) -> None:
        obj = await manager.client.get(CONFIGMAP, request.name, namespace=request.namespace)
        for _ in range(2):  # the same event twice: one object with a series
            await recorder.event(obj, "Normal", "Checked", "looked at it")
        recorded.set()

    mcr.controller_managed_by(manager).named("eventful").for_(CONFIGMAP, namespace=namespace).complete(record)
    async with running(manager):
        await asyncio.wait_for(recorded.wait(), 30)
    async with mcr.Cluster("east", config_of(east)) as cluster:
        events = (await cluster.client.list(EVENT, namespace=namespace)).items
    async with mcr.Cluster("west", config_of(west)) as cluster:
        elsewhere = (await cluster.client.list(EVENT, namespace=namespace)).items
    assert len(events) == 1
    event = events[0]
    assert event["regarding"]["name"] == "target" and event["regarding"]["kind"] == "ConfigMap"
    assert event["reason"] == "Checked" and event["reportingController"] == "eventful"
    assert event["series"]["count"] == 2
    assert elsewhere == []


async def test_a_repeat_whose_event_is_gone_is_recorded_as_a_new_event(fleet: Fleet) -> None:
    # Events expire (an hour by default) while a series may recur for longer; a repeat then
    # must be a new Event, not a patch of nothing dropped without a word.
    plane = fleet["cluster-1"]
    namespace = await _namespace(plane, "expired", ["target"])
    provider = mcr.StaticProvider({"east": config_of(plane)})
    manager = mcr.Manager(provider, handle_signals=False)
    recorder = manager.event_recorder("expiring")
    async with running(manager), mcr.Cluster("east", config_of(plane)) as cluster:
        obj = await cluster.client.get(CONFIGMAP, "target", namespace=namespace)
        await recorder.event(obj, "Warning", "Stuck", "cannot go on", cluster="east")
        first = (await cluster.client.list(EVENT, namespace=namespace)).items
        assert [item["reason"] for item in first] == ["Stuck"]
        await cluster.client.delete(EVENT, first[0]["metadata"]["name"], namespace=namespace)
        await recorder.event(obj, "Warning", "Stuck", "cannot go on", cluster="east")
        again = (await cluster.client.list(EVENT, namespace=namespace)).items
    assert [item["reason"] for item in again] == ["Stuck"]
    assert again[0]["metadata"]["name"] != first[0]["metadata"]["name"]
    assert "series" not in again[0]


# --- logs --------------------------------------------------------------------------------------


async def test_reconcile_logs_carry_the_context_and_json_is_one_object_per_line() -> None:
    import json

    channel: asyncio.Queue[mcr.Request | mcr.ObjectEvent] = asyncio.Queue()
    logger = logging.getLogger("test.reconciler")

    async def noisy(request: mcr.Request) -> None:
        logger.warning("working on it")

    controller = mcr.Controller("noisy", noisy)
    controller.watch(mcr.ChannelSource(channel))
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    handler = Keep()
    handler.addFilter(ReconcileContextFilter())
    logger.addHandler(handler)
    try:
        runner = asyncio.create_task(controller.start())
        await channel.put(mcr.Request("east", "team-a", "web"))
        await wait_until(lambda: records)
        await controller.shutdown(1)
        await runner
    finally:
        logger.removeHandler(handler)
    record = records[0]
    context = tuple(getattr(record, field) for field in ("cluster", "controller", "namespace", "object"))
    assert context == ("east", "noisy", "team-a", "web")
    line = json.loads(JSONFormatter().format(record))
    assert line["cluster"] == "east" and line["object"] == "web" and line["message"] == "working on it"


async def test_no_token_or_key_reaches_the_logs_of_a_whole_run(
    fleet: Fleet, caplog: pytest.LogCaptureFixture
) -> None:
    east, west = fleet["cluster-1"], fleet["cluster-2"]
    namespace = await _namespace(east, "secrets", ["x"])
    robot = east.add_token_user(unique("robot"))
    assert robot.token and west.cert_user.client_cert is not None
    bad = east.kubeconfig(east.token_user)
    bad["users"][0]["user"]["token"] = "definitely-wrong-" + "s3cr3t"
    provider = mcr.StaticProvider(
        {
            "token": config_of(east, robot),
            "cert": config_of(west, west.cert_user),
            "bad": mcr.kubeconfig_from_dict(bad),
        },
        options=mcr.ClusterOptions(retry=mcr.RetryPolicy(attempts=1), cache_sync_timeout=3),
        probe_interval=0.5,
    )
    manager = mcr.Manager(
        provider, health_probe_address="127.0.0.1:0", metrics_address="127.0.0.1:0", handle_signals=False
    )
    done = asyncio.Event()

    async def reconcile(request: mcr.Request) -> None:
        logging.getLogger("test.secrets").info(
            "reconciling %s with %r", request, await manager.get_cluster(request.cluster)
        )
        if request.cluster == "token":
            done.set()
        raise RuntimeError(f"fail once in {request.cluster} to log a traceback")

    mcr.controller_managed_by(manager).for_(CONFIGMAP, namespace=namespace).with_options(
        rate_limiter=ExponentialBackoff(base=0.5, cap=1)
    ).complete(reconcile)
    with caplog.at_level(logging.DEBUG):
        async with running(manager):
            await asyncio.wait_for(done.wait(), 30)
            await wait_until(lambda: provider.statuses()["bad"].phase is mcr.ClusterPhase.UNHEALTHY)
            await _get(manager.endpoints.url("/readyz") + "?verbose")
            await _get(manager.endpoints.url("/metrics"))
    text = caplog.text + "\n".join(repr(record.args) for record in caplog.records)
    assert "reconciling" in text
    assert "'bad' is unhealthy" in text and "401" in text
    key_pem = west.cert_user.client_cert.key_pem
    secrets = [
        robot.token,
        "s3cr3t",
        east.token_user.token or "",
        key_pem.decode().splitlines()[1],
        base64.b64encode(key_pem).decode()[:40],
    ]
    for secret in secrets:
        assert secret not in text


# --- settings --------------------------------------------------------------------------------


def test_settings_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MCRUNTIME_MAX_CONCURRENT_RECONCILES", "4")
    monkeypatch.setenv("MCRUNTIME_LEADER_ELECTION", "true")
    monkeypatch.setenv("MCRUNTIME_LOG_FORMAT", "json")
    settings = mcr.ManagerSettings.load()
    assert settings.max_concurrent_reconciles == 4
    assert settings.leader_election is True
    assert settings.log_format == "json"


def test_a_wrong_setting_names_its_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MCRUNTIME_MAX_CONCURRENT_RECONCILES", "zero")
    monkeypatch.setenv("MCRUNTIME_LOG_LEVEL", "LOUD")
    with pytest.raises(mcr.SettingsError) as raised:
        mcr.ManagerSettings.load()
    message = str(raised.value)
    assert "MCRUNTIME_MAX_CONCURRENT_RECONCILES" in message and "MCRUNTIME_LOG_LEVEL" in message


def test_inconsistent_lease_timing_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MCRUNTIME_LEADER_ELECTION", "1")
    monkeypatch.setenv("MCRUNTIME_RENEW_DEADLINE", "30")
    with pytest.raises(mcr.SettingsError, match="MCRUNTIME_LEASE_DURATION > MCRUNTIME_RENEW_DEADLINE"):
        mcr.ManagerSettings.load()


def test_a_manager_from_settings_uses_them(fleet: Fleet, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MCRUNTIME_LEADER_ELECTION", "true")
    monkeypatch.setenv("MCRUNTIME_LEADER_ELECTION_ID", "from-env")
    monkeypatch.setenv("MCRUNTIME_METRICS_BIND_ADDRESS", "")
    manager = mcr.Manager.from_settings(local=config_of(fleet["cluster-1"]))
    assert manager.elector is not None and manager.elector.config.name == "from-env"
    assert manager.settings is not None and manager.settings.metrics_bind_address in ("", None)
    assert manager.field_manager is None
    # A 1.0 factory's Manager(provider, field_manager=...) keeps its name when it moves over.
    named = mcr.Manager.from_settings(local=config_of(fleet["cluster-1"]), field_manager="my-operator")
    assert named.field_manager == "my-operator"
