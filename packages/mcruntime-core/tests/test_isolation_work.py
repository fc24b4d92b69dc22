"""A hung cluster costs the healthy ones nothing: per-cluster lanes, on real control planes.

One of three kube-apiservers is stopped with SIGSTOP (it hangs; it does not
refuse). A controller with default options, whose reconcile reads live, must
keep reconciling the other two clusters at once. ``MCRUNTIME_TEST_HANG_SECONDS``
shortens the hang for local runs; CI runs the full 60 s.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import statistics
import time

import aiohttp
import pytest
from kube_helpers import CONFIGMAP, configmap, stop, unique

import mcruntime as mcr
from mcruntime.testing import ControlPlane, Fleet, running, wait_until

# When the suite runs in parallel, no other test runs beside this module's:
# it times a hang and the healthy clusters' latency during it.
pytestmark = pytest.mark.alone

HANG_SECONDS = float(os.environ.get("MCRUNTIME_TEST_HANG_SECONDS", "60"))
CREATE_INTERVAL = 0.25  # one new ConfigMap every 0.25 s, alternating between the healthy clusters
PENDING = 3  # requests queued for the hung cluster during the hang


def _config(plane: ControlPlane) -> mcr.ClusterConfig:
    return mcr.kubeconfig_from_dict(plane.kubeconfig())


async def _readyz_names(manager: mcr.Manager, cluster: str) -> bool:
    """Whether /readyz?verbose reports ``cluster`` as failing because it does not answer."""
    async with (
        aiohttp.ClientSession() as session,
        session.get(manager.endpoints.url("/readyz") + "?verbose") as response,
    ):
        body = await response.text()
    return f"[-]cluster:{cluster} failed: unhealthy: no answer to GET /version" in body


def _percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


async def test_a_sigstopped_cluster_costs_the_healthy_ones_no_reconcile_latency(
    fleet: Fleet, fresh_cluster: ControlPlane
) -> None:
    # The fresh cluster's plane name may repeat a fleet cluster's: the provider names them itself.
    planes = {"healthy-a": fleet["cluster-1"], "healthy-b": fleet["cluster-2"], "hung": fresh_cluster}
    healthy = ["healthy-a", "healthy-b"]
    hung = "hung"
    namespace = unique("isolation")
    writers: dict[str, mcr.Cluster] = {}
    async with contextlib.AsyncExitStack() as stack:
        for name, plane in planes.items():
            writer = await stack.enter_async_context(mcr.Cluster(f"writer-{name}", _config(plane)))
            await writer.client.create(
                {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}
            )
            writers[name] = writer
        for index in range(PENDING):
            await writers[hung].client.create(configmap(f"pending-{index}", namespace, t="0"))

        provider = mcr.StaticProvider({name: _config(plane) for name, plane in planes.items()})
        manager = mcr.Manager(provider, handle_signals=False, health_probe_address="127.0.0.1:0")
        reconciled_at: dict[tuple[str, str], float] = {}
        pending_done: set[str] = set()
        hang_started = asyncio.Event()
        trigger: asyncio.Queue[mcr.Request | mcr.ObjectEvent] = asyncio.Queue()

        async def reconcile(request: mcr.Request) -> None:
            # Only a reconcile that began after the SIGSTOP sends its GET to a stopped server; one
            # already in flight then (a second event for the object, say) may get its answer.
            began_hung = request.cluster == hung and hang_started.is_set()
            cluster = await manager.client.cluster()
            obj = await cluster.client.get(CONFIGMAP, request.name, namespace=request.namespace)  # live
            now = time.time()
            reconciled_at.setdefault((request.cluster, request.name), now)
            if began_hung:
                pending_done.add(request.name)
            assert obj["metadata"]["name"] == request.name

        controller = (
            mcr.controller_managed_by(manager)
            .named("isolation")
            .for_(CONFIGMAP, predicates=(mcr.in_namespaces(namespace),))
            .watches_channel(trigger)
            .complete(reconcile)
        )
        assert (controller.max_concurrent_reconciles, controller.max_total_reconciles) == (1, 256)

        async with running(manager):
            await wait_until(lambda: all((hung, f"pending-{i}") in reconciled_at for i in range(PENDING)))
            process = planes[hung].apiserver.process
            assert process is not None and process.pid is not None
            created: dict[tuple[str, str], float] = {}
            stop(process.pid)
            try:
                hang_started.set()
                hang_began = time.monotonic()
                # The hung cluster's lane fills with live GETs that get no answer.
                for index in range(PENDING):
                    await trigger.put(mcr.Request(hung, namespace, f"pending-{index}"))
                await wait_until(lambda: controller.queue.processing_by_group().get(hung) == 1)
                readyz_named_hung: float | None = None
                index = 0
                stop_creating_at = hang_began + HANG_SECONDS
                while time.monotonic() < stop_creating_at:
                    target = healthy[index % 2]
                    cm_name = f"cm-{index}"
                    created[(target, cm_name)] = time.time()
                    await writers[target].client.create(configmap(cm_name, namespace))
                    index += 1
                    if readyz_named_hung is None and await _readyz_names(manager, hung):
                        readyz_named_hung = time.monotonic() - hang_began
                    await asyncio.sleep(CREATE_INTERVAL)  # the creation rate, not a synchronisation
                # Every healthy write is reconciled while the other cluster is still hung (it stays
                # hung until the SIGCONT below): healthy work never waits for it. How fast is the
                # figure printed below, and S11's in benchmarks/.
                await wait_until(lambda: set(created) <= set(reconciled_at), timeout=60)
                still_hung = time.monotonic() - hang_began
                assert still_hung >= HANG_SECONDS
                assert pending_done == set(), "a reconcile of the stopped cluster completed"
                # /readyz named the hung cluster while it was still hung (when: printed below).
                assert readyz_named_hung is not None
            finally:
                os.kill(process.pid, signal.SIGCONT)

            latencies = [reconciled_at[key] - stamp for key, stamp in created.items()]
            p50, p99 = statistics.median(latencies), _percentile(latencies, 0.99)
            print(
                f"hung for {still_hung:.0f}s: {len(latencies)} healthy ConfigMaps reconciled during the hang, "
                f"create->reconcile p50 {p50 * 1000:.0f} ms, p99 {p99 * 1000:.0f} ms, max {max(latencies) * 1000:.0f} ms"
            )
            assert len(latencies) >= HANG_SECONDS / CREATE_INTERVAL / 2
            # After SIGCONT the hung cluster's queued work is done (it waited for the probe, not
            # on a backoff grown through the hang) and the cluster is healthy again.
            resumed = time.monotonic()
            await wait_until(lambda: pending_done == {f"pending-{i}" for i in range(PENDING)}, timeout=60)
            print(
                f"readyz named the hung cluster after {readyz_named_hung:.1f}s; its pending work was done "
                f"{time.monotonic() - resumed:.1f}s after SIGCONT"
            )
            await wait_until(lambda: manager.clusters()[hung].health.healthy, timeout=10)
            assert not await _readyz_names(manager, hung)
