"""One sharded replica in a process of its own, for the sharding tests.

Usage: python shard_replica.py SPEC.json IDENTITY [WEIGHT]

SPEC holds the hub kubeconfig path, the clusters (name → kubeconfig path), the
namespace for the Leases and the ConfigMaps, the group name and the lease
timing. Each cluster's work is one ConfigMap labelled with the cluster's name
(several cluster names share an API server): the reconcile stamps this
replica's identity, the version of the fence it holds and a counter on it and
comes back every ``period`` seconds, so a second writer would show up in the
ConfigMap's history. The process prints one JSON line whenever the set of
clusters it owns changes, and stops gracefully on SIGTERM.

With ``"lean": true`` (the fleet-scale tests: hundreds of clusters per
process on two cores) the replica keeps no informer on the member clusters:
it stamps a cluster when it gains it (fed through a channel) and then every
``period`` seconds, reading and writing the ConfigMap live. Health probes of
the members are slowed to ``probe_interval``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import sys
import time
from pathlib import Path
from typing import Any

import mcruntime as mcr
from mcruntime._coordination.coordinator import WorkGate

CONFIGMAP = mcr.Kind("v1", "ConfigMap")
CLUSTER_LABEL = "shard-test/cluster"


def sharded_manager(
    spec: dict[str, Any], identity: str, weight: float, *, handle_signals: bool = True
) -> mcr.Manager:
    """A sharded manager over the spec's clusters, stamping its identity on each cluster's ConfigMap."""
    namespace = spec["namespace"]
    coordinator = mcr.ShardedCoordinator(
        mcr.ShardingConfig(
            name=spec["group"],
            namespace=namespace,
            identity=identity,
            weight=weight,
            lease_duration=spec["lease_duration"],
            renew_deadline=spec["renew_deadline"],
            retry_period=spec["retry_period"],
            peer_gc_after=float(spec.get("peer_gc_after", 300.0)),
            shards=int(spec.get("shards", mcr.ShardingConfig.shards)),
        )
    )
    loaded: dict[str, mcr.ClusterConfig] = {}
    for path in set(spec["clusters"].values()):
        loaded[path] = mcr.load_kubeconfig(path)
    provider = mcr.StaticProvider(
        {name: loaded[path] for name, path in spec["clusters"].items()},
        probe_interval=float(spec.get("probe_interval", 10.0)),
    )
    manager = mcr.Manager(
        provider,
        local=mcr.load_kubeconfig(spec["hub"]),
        coordinator=coordinator,
        handle_signals=handle_signals,
    )
    period = float(spec.get("period", 1.0))

    def fence_version(cluster: str) -> str:
        """The resourceVersion of the fence this replica holds for ``cluster``'s shard, as it wrote it.

        Stamped with each write, so the test can tell a write made under a fence
        another replica had already taken (a second owner) from one made after
        taking it back.
        """
        held = coordinator._fences.held.get(coordinator.config.shard_of(cluster))
        return str(((held or {}).get("metadata") or {}).get("resourceVersion", ""))

    async def stamp(request: mcr.Request) -> mcr.Result:
        cluster = await manager.get_cluster(request.cluster)
        current = await cluster.client.get(CONFIGMAP, request.name, namespace=request.namespace)
        data = current.get("data") or {}
        waited = time.time() - float(data.get("at", "0"))
        if waited < period and data.get("writer") == identity:
            return mcr.Result(requeue_after=period - waited)  # our own write's event: not due yet
        current["data"] = {
            **data,
            "writer": identity,
            "fence": fence_version(request.cluster),
            "count": str(int(data.get("count", "0")) + 1),
            "at": repr(time.time()),
        }
        await cluster.client.update(current)  # resourceVersion: a concurrent writer gets a Conflict
        return mcr.Result(requeue_after=period)

    def own_cluster(event: mcr.ObjectEvent) -> bool:
        labels = event.object.get("metadata", {}).get("labels") or {}
        return labels.get(CLUSTER_LABEL) == event.cluster

    if spec.get("lean"):
        gained: asyncio.Queue[mcr.Request | mcr.ObjectEvent] = asyncio.Queue()
        (
            mcr.controller_managed_by(manager)
            .named("stamp")
            .watches_channel(gained)
            .with_options(max_concurrent_reconciles=8)
            .complete(stamp)
        )
        manager.add(_OwnershipReporter(coordinator, gained, namespace, manager.work))
        return manager
    (
        mcr.controller_managed_by(manager)
        .named("stamp")
        .for_(CONFIGMAP, namespace=namespace, predicates=[own_cluster], clusters=mcr.PROVIDER_ONLY)
        .complete(stamp)
    )
    manager.add(_OwnershipReporter(coordinator))
    return manager


class _OwnershipReporter:
    """Prints the owned set whenever it changes (what the test follows); feeds gained clusters to ``gained``."""

    def __init__(
        self,
        coordinator: mcr.ShardedCoordinator,
        gained: asyncio.Queue[mcr.Request | mcr.ObjectEvent] | None = None,
        namespace: str = "",
        gate: WorkGate | None = None,
    ) -> None:
        self._coordinator = coordinator
        self._gained = gained
        self._namespace = namespace
        self._gate = gate

    async def start(self) -> None:
        reported: frozenset[str] | None = None
        opened: frozenset[str] = frozenset()
        while True:
            if self._gained is not None and self._gate is not None:
                # Fed once the gate admits the cluster: a request before that is dropped.
                now_open = self._gate.opened
                for cluster in sorted(now_open - opened):
                    if cluster:  # the hub's own shard has no ConfigMap to stamp
                        self._gained.put_nowait(mcr.Request(cluster, self._namespace, cluster))
                opened = now_open
            owned = self._coordinator.owned
            if owned != reported:
                reported = owned
                print(json.dumps({"owned": sorted(owned), "time": time.time()}), flush=True)
            await asyncio.sleep(0.05)


def _dump_tasks() -> None:
    """On SIGUSR2, every task's stack to stderr: what a stuck replica is waiting for."""
    for task in asyncio.all_tasks():
        task.print_stack(limit=6, file=sys.stderr)


async def main(spec_path: str, identity: str, weight: str = "1") -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    asyncio.get_running_loop().add_signal_handler(signal.SIGUSR2, _dump_tasks)
    spec = json.loads(Path(spec_path).read_text())
    await sharded_manager(spec, identity, float(weight)).start()
    print(json.dumps({"stopped": True, "time": time.time()}), flush=True)


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:4]))
