"""Three sharded manager processes (``shard_replica.py``) against one hub, and the record of who wrote what.

Every cluster's work is one ConfigMap labelled with its name. ``Writes``
watches them and records, in order, which replica wrote each version, so a
test can tell a second writer while a fence was held: a cluster going back to
a replica it had left.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kube_helpers import CONFIGMAP, running_cluster, unique
from shard_replica import CLUSTER_LABEL

import mcruntime as mcr
from mcruntime._coordination.rendezvous import owner as rendezvous_owner
from mcruntime.testing import Fleet, wait_until

CLUSTERS = [f"c{index:02d}" for index in range(30)]
SCRIPT = Path(__file__).with_name("shard_replica.py")


@dataclass
class Replica:
    identity: str
    process: asyncio.subprocess.Process
    owned: set[str] = field(default_factory=set)
    history: list[tuple[float, frozenset[str]]] = field(default_factory=list)
    stopped: bool = False
    reader: asyncio.Task[None] | None = None

    async def follow(self) -> None:
        assert self.process.stdout is not None
        async for line in self.process.stdout:
            try:
                report = json.loads(line)
            except ValueError:
                continue
            if "owned" in report:
                self.owned = set(report["owned"])
                self.history.append((time.monotonic(), frozenset(self.owned)))
            if report.get("stopped"):
                self.stopped = True


@dataclass
class Writes:
    """Every stamped version of every cluster's ConfigMap, in the order its API server applied them."""

    by_cluster: dict[str, list[tuple[float, str]]] = field(default_factory=dict)
    fences: dict[str, list[str]] = field(default_factory=dict)  # cluster → fence version of each write

    def record(self, obj: dict[str, Any]) -> None:
        cluster = (obj["metadata"].get("labels") or {}).get(CLUSTER_LABEL)
        data = obj.get("data") or {}
        writer = data.get("writer")
        if cluster and writer:
            self.by_cluster.setdefault(cluster, []).append((time.monotonic(), writer))
            self.fences.setdefault(cluster, []).append(str(data.get("fence", "")))

    def last_writer(self, cluster: str, since: float = 0.0) -> str | None:
        recent = [writer for moment, writer in self.by_cluster.get(cluster, []) if moment >= since]
        return recent[-1] if recent else None

    def first_write_by(self, cluster: str, writers: set[str], since: float) -> float | None:
        for moment, writer in self.by_cluster.get(cluster, []):
            if moment >= since and writer in writers:
                return moment
        return None

    def superseded(self) -> dict[str, list[str]]:
        """Clusters written under a fence after another replica had written under a newer one.

        Each write carries the resourceVersion of the fence its writer held
        (a write with none counts as the oldest). A replica that wrote, lost its
        shard and wrote again after taking it back stamps a newer fence the
        second time; a replica that went on writing after another took its
        fence stamps the old one: two owners at once. Each found cluster lists
        its writes as ``writer@fence``.
        """
        found = {}
        for cluster, writes in self.by_cluster.items():
            newest, newest_writer = -1, ""
            stamped = [
                (writer, fence) for (_, writer), fence in zip(writes, self.fences[cluster], strict=True)
            ]
            for writer, fence in stamped:
                version = int(fence) if fence.isdigit() else -1
                if version < newest and writer != newest_writer:
                    found[cluster] = [f"{w}@{f or 'none'}" for w, f in stamped]
                    break
                if version > newest:
                    newest, newest_writer = version, writer
        return found


@dataclass
class Shards:
    fleet: Fleet
    spec_path: Path
    spec: dict[str, Any]
    writes: Writes
    replicas: dict[str, Replica] = field(default_factory=dict)
    clusters: list[str] = field(default_factory=lambda: list(CLUSTERS))

    async def start(self, identity: str, weight: float = 1.0) -> Replica:
        with (self.spec_path.parent / f"{identity}.log").open("ab") as log_file:
            process = await asyncio.create_subprocess_exec(
                sys.executable,
                str(SCRIPT),
                str(self.spec_path),
                identity,
                str(weight),
                stdout=asyncio.subprocess.PIPE,
                stderr=log_file,
            )
        replica = Replica(identity, process)
        replica.reader = asyncio.create_task(replica.follow())
        self.replicas[identity] = replica
        return replica

    def live(self) -> dict[str, Replica]:
        return {
            name: r for name, r in self.replicas.items() if r.process.returncode is None and not r.stopped
        }

    def expected(self, weights: dict[str, float]) -> dict[str, set[str]]:
        result: dict[str, set[str]] = {name: set() for name in weights}
        config = mcr.ShardingConfig(shards=self.spec.get("shards", mcr.ShardingConfig.shards))
        for cluster in [*self.clusters, mcr.LOCAL_CLUSTER]:  # the hub's own work is sharded too
            # Clusters move a shard at a time: the owner of the cluster's shard owns it.
            chosen = rendezvous_owner(str(config.shard_of(cluster)), weights)
            assert chosen is not None
            result[chosen].add(cluster)
        return result

    async def settled(self, weights: dict[str, float], since: float = 0.0, timeout: float = 60.0) -> None:
        """Wait until each live replica owns exactly its rendezvous share and has written all of it."""
        expected = self.expected(weights)

        def done() -> bool:
            live = self.live()
            if set(live) != set(weights):
                return False
            for name, clusters in expected.items():
                if live[name].owned != clusters:
                    return False
                if any(self.writes.last_writer(c, since) != name for c in clusters if c):
                    return False
            return True

        try:
            await wait_until(done, timeout=timeout, interval=0.05 if len(self.clusters) <= 100 else 0.5)
        except AssertionError as error:
            raise AssertionError(f"{error}\n{self.describe(expected, since)}") from None

    def describe(self, expected: dict[str, set[str]], since: float) -> str:
        """What each replica owns against what it should, its unwritten clusters, and its log's tail."""
        lines = []
        for name, replica in self.replicas.items():
            want = expected.get(name, set())
            unwritten = sorted(c for c in want if c and self.writes.last_writer(c, since) != name)
            log_path = self.spec_path.parent / f"{name}.log"
            tail = log_path.read_text().splitlines()[-8:] if log_path.exists() else []
            lines.append(
                f"{name} (exit {replica.process.returncode}): owns {sorted(replica.owned)}, "
                f"expected {sorted(want)}, unwritten {unwritten}"
            )
            lines.extend(f"    {line}" for line in tail)
        return "\n".join(lines)

    async def close(self) -> None:
        for replica in self.replicas.values():
            if replica.process.returncode is None:
                replica.process.kill()
            await replica.process.wait()
            if replica.reader is not None:
                replica.reader.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await replica.reader


@contextlib.asynccontextmanager
async def shard_group(
    fleet: Fleet,
    tmp_path: Path,
    *,
    lease_duration: float = 3.0,
    renew_deadline: float = 2.0,
    names: list[str] | None = None,
    extra: dict[str, Any] | None = None,
) -> AsyncIterator[Shards]:
    """Clusters (30 unless ``names``) over the fleet's three API servers, one ConfigMap each, and a watch on them."""
    names = names or list(CLUSTERS)
    namespace = unique("shards")
    planes = [fleet["cluster-1"], fleet["cluster-2"], fleet["cluster-3"]]
    clusters = {name: str(planes[index % 3].kubeconfig_path()) for index, name in enumerate(names)}
    spec = {
        "hub": str(planes[0].kubeconfig_path()),
        "clusters": clusters,
        "namespace": namespace,
        "group": "shards",
        "lease_duration": lease_duration,
        "renew_deadline": renew_deadline,
        "retry_period": 0.5,
        "period": 1.0,
        **(extra or {}),
    }
    tmp_path.mkdir(parents=True, exist_ok=True)
    spec_path = tmp_path / "spec.json"
    spec_path.write_text(json.dumps(spec))
    writes = Writes()
    creating = asyncio.Semaphore(16)
    async with contextlib.AsyncExitStack() as stack:
        for index, plane in enumerate(planes):
            cluster = await stack.enter_async_context(running_cluster(plane, f"watch-{index}"))
            await cluster.client.create(
                {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}
            )

            async def create(name: str, client: mcr.Client = cluster.client) -> None:
                async with creating:
                    await client.create(
                        {
                            "apiVersion": "v1",
                            "kind": "ConfigMap",
                            "metadata": {
                                "name": name,
                                "namespace": namespace,
                                "labels": {CLUSTER_LABEL: name},
                            },
                            "data": {"count": "0"},
                        }
                    )

            await asyncio.gather(*(create(name) for name in names[index::3]))
            informer = cluster.cache.informer(CONFIGMAP, namespace=namespace)
            informer.add_handler(mcr.ResourceEventHandler(on_update=lambda _old, new: writes.record(new)))
            assert await informer.wait_for_sync(30)
        shards = Shards(fleet, spec_path, spec, writes, clusters=names)
        try:
            yield shards
        finally:
            await shards.close()
        superseded = writes.superseded()
        assert not superseded, f"a replica wrote under a fence another had taken since: {superseded}"
