"""job-fanout under ``mcruntime run`` with deploy/'s identities and RBAC, and nothing more.

As in a real deployment: an administrator applies the namespace, the CRD,
``hub/identity.yaml`` and the generated ``hub/rbac.yaml`` to the hub, and the
generated ``member/rbac.yaml`` with ``member/access.yaml`` to each member; the
controller then runs as the ``job-fanout`` ServiceAccount (a real token) on the
hub and as the members' own ``job-fanout`` ServiceAccounts, on API servers that
authorize with RBAC.
A Test fans out to every cluster, finishes, and is deleted (Jobs removed
everywhere, finalizer released); the manager then drains on SIGTERM. A missing
permission would stall the Test or show up as a 403 in the log.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import socket
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import yaml

import mcruntime as mcr
from example_testing import admin_cluster, eventually, write_kubeconfig
from job_fanout import JOB, TEST, make_test
from mcruntime.testing import ControlPlane, Fleet

DEPLOY = Path(__file__).parent / "deploy"
ADMIN = "deploy-admin"
MEMBERS = {"east": "cluster-2", "west": "cluster-3"}


def documents(*files: str) -> Iterator[dict[str, Any]]:
    for name in files:
        yield from (doc for doc in yaml.safe_load_all((DEPLOY / name).read_text()) if doc)


async def apply(plane: ControlPlane, *files: str) -> None:
    """What the administrator does with kubectl apply: namespaces first, then the rest."""
    ordered = sorted(documents(*files), key=lambda doc: doc["kind"] != "Namespace")
    async with admin_cluster(plane) as cluster:
        for doc in ordered:
            await cluster.client.apply(doc, field_manager=ADMIN, force=True)


def kubeconfig_as(plane: ControlPlane, account: str, context: str) -> dict[str, Any]:
    """A kubeconfig for ``account`` (a ServiceAccount in job-fanout, with a fresh token) named ``context``."""
    user = plane.add_token_user(account, cluster_admin=False, namespace="job-fanout")
    single = plane.kubeconfig(user)
    single["clusters"][0]["name"] = single["contexts"][0]["context"]["cluster"] = context
    single["users"][0]["name"] = single["contexts"][0]["context"]["user"] = context
    single["contexts"][0]["name"] = single["current-context"] = context
    return single


def free_port() -> int:
    """A loopback port that was free a moment ago (for the probe server)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


async def probe_ok(port: int, path: str) -> bool:
    try:
        async with (
            aiohttp.ClientSession() as session,
            session.get(f"http://127.0.0.1:{port}{path}", timeout=aiohttp.ClientTimeout(total=2)) as response,
        ):
            return response.status == 200
    except (aiohttp.ClientError, TimeoutError):  # not listening yet, or not answering
        return False


async def test_job_fanout_works_with_exactly_the_deploy_rbac(workload_fleet: Fleet, tmp_path: Path) -> None:
    hub = workload_fleet["cluster-1"]
    await apply(hub, "hub/namespace.yaml", "hub/crd.yaml", "hub/identity.yaml", "hub/rbac.yaml")
    members = tmp_path / "members"
    members.mkdir()
    for name, plane_name in MEMBERS.items():
        plane = workload_fleet[plane_name]
        await apply(plane, "member/rbac.yaml", "member/access.yaml")
        write_kubeconfig(members / f"{name}.kubeconfig", kubeconfig_as(plane, "job-fanout", name))
    hub_kubeconfig = write_kubeconfig(tmp_path / "hub.kubeconfig", kubeconfig_as(hub, "job-fanout", "hub"))

    async with admin_cluster(hub) as main:
        namespace = f"deploy-{os.getpid()}-{tmp_path.name[-8:]}".lower().replace("_", "-")
        await main.client.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
        probes = free_port()
        env = {name: value for name, value in os.environ.items() if not name.startswith("MCRUNTIME_")}
        env.pop("KUBERNETES_SERVICE_HOST", None)
        env.update(
            KUBECONFIG=str(hub_kubeconfig),
            JOB_FANOUT_CLUSTERS=str(members),
            JOB_FANOUT_NAMESPACE=namespace,
            MCRUNTIME_LEADER_ELECTION="true",
            MCRUNTIME_LEADER_ELECTION_ID=f"job-fanout-{namespace}",
            MCRUNTIME_LEADER_ELECTION_NAMESPACE="job-fanout",
            MCRUNTIME_HEALTH_PROBE_BIND_ADDRESS=f"127.0.0.1:{probes}",
            MCRUNTIME_METRICS_BIND_ADDRESS="",
        )
        log_path = tmp_path / "job-fanout.log"
        with log_path.open("wb") as log_file:
            process = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "mcruntime",
                "run",
                "job_fanout:operator",
                cwd=Path(__file__).parent,
                env=env,
                stdout=asyncio.subprocess.DEVNULL,
                stderr=log_file,
            )
        try:
            await eventually(lambda: probe_ok(probes, "/readyz"), "/readyz passes with the deploy identity")
            await main.client.create(make_test("deployed", namespace, command=("sh", "-c", "echo hi")))

            async def finished() -> bool:
                test = await main.client.get(TEST, "deployed", namespace=namespace)
                return (test.get("status") or {}) == {
                    "phase": "finished",
                    "clusters": {"east": "succeeded", "main": "succeeded", "west": "succeeded"},
                }

            await eventually(finished, "the Test finished in main, east and west", timeout=90)
            await main.client.delete(TEST, "deployed", namespace=namespace)

            async def gone() -> bool:
                try:
                    await main.client.get(TEST, "deployed", namespace=namespace)
                except mcr.NotFound:
                    return True
                return False

            await eventually(gone, "the Test deleted, its finalizer released")
            for plane_name in MEMBERS.values():
                async with admin_cluster(workload_fleet[plane_name]) as member:
                    jobs = await member.client.list(JOB, namespace=namespace)
                    assert [job for job in jobs.items if not job["metadata"].get("deletionTimestamp")] == []
            process.send_signal(signal.SIGTERM)
            code = await asyncio.wait_for(process.wait(), 30 + 10 + 5)
        finally:
            if process.returncode is None:
                process.kill()
                await process.wait()
        log = log_path.read_text()
        assert code == 0, log
        assert not refusals(log), log


def refusals(log: str) -> list[str]:
    """The log's mentions of a 403 or of being forbidden.

    Timestamps are taken out first: a line logged at ``…:29,403`` names no refusal.
    """
    text = re.sub(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} ", "", log, flags=re.MULTILINE)
    return re.findall(r".*(?:\b403\b|forbidden).*", text, flags=re.IGNORECASE)
