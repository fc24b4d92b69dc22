"""``mcruntime run`` end to end, as a subprocess against a testbed cluster, as a pod would run it.

The factory module is written to ``tmp_path``; the hub is a testbed cluster
reached through ``KUBECONFIG``. A reconcile that is in flight when SIGTERM
arrives waits for a file the test writes only after the signal, so the drain
is seen doing its work rather than assumed.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
from kube_helpers import CONFIGMAP, new_namespace, running_cluster, unique, wait_for

import mcruntime as mcr
from mcruntime.testing import ControlPlane, Fleet
from mcruntime.testing._net import free_port, http_get

LEASE = mcr.Kind("coordination.k8s.io/v1", "Lease")

FACTORY = '''
"""A manager whose reconcile of ConfigMap "slow" says it STARTED on which loop, waits for PROCEED, then marks it finished."""

import asyncio
import os
from pathlib import Path

import mcruntime as mcr

CONFIGMAP = mcr.Kind("v1", "ConfigMap")
WORK = Path(os.environ["CLI_TEST_DIR"])


def factory(settings: mcr.ManagerSettings) -> mcr.Manager:
    manager = mcr.Manager.from_settings(local=mcr.load_kubeconfig_env(), settings=settings)
    namespace = os.environ["CLI_TEST_NAMESPACE"]

    async def reconcile(request: mcr.Request) -> None:
        if request.name != "slow":
            return
        # Which loop runs it, written whole (a rename), so a reader never sees the file empty.
        (WORK / "started.part").write_text(type(asyncio.get_running_loop()).__module__)
        os.replace(WORK / "started.part", WORK / "started")
        while not (WORK / "proceed").exists():  # the work in flight: it ends when the test says so
            await asyncio.sleep(0.05)
        cluster = await manager.get_cluster(mcr.LOCAL_CLUSTER)
        patch = {"metadata": {"annotations": {"cli-test/finished": "yes"}}}
        await cluster.client.patch(CONFIGMAP, request.name, patch, namespace=request.namespace)

    mcr.controller_managed_by(manager).named("slow").for_(CONFIGMAP, namespace=namespace).complete(reconcile)
    return manager
'''


@dataclass
class Operator:
    process: asyncio.subprocess.Process
    probes: int
    work: Path
    log: Path

    async def stderr(self) -> str:
        return self.log.read_text()

    async def exit_code(self, timeout: float) -> int:
        return await asyncio.wait_for(self.process.wait(), timeout)


def environment(plane: ControlPlane, work: Path, namespace: str) -> dict[str, str]:
    env = {name: value for name, value in os.environ.items() if not name.startswith("MCRUNTIME_")}
    env.update(KUBECONFIG=str(plane.kubeconfig_path()), CLI_TEST_DIR=str(work), CLI_TEST_NAMESPACE=namespace)
    return env


async def mcruntime(*argv: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    """Run ``python -m mcruntime`` to completion: exit code, stdout, stderr."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "mcruntime",
        *argv,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


async def spawn_run(
    target: str, probes: int, log: Path, env: dict[str, str], *flags: str
) -> asyncio.subprocess.Process:
    """``mcruntime run target`` with its probes on ``probes``, no metrics, stderr to ``log``."""
    with log.open("wb") as stderr:
        return await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "mcruntime",
            "run",
            target,
            "--health-probe-bind-address",
            f"127.0.0.1:{probes}",
            "--metrics-bind-address",
            "",
            *flags,
            env=env,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=stderr,
        )


@asynccontextmanager
async def operator(
    plane: ControlPlane, tmp_path: Path, namespace: str, *flags: str
) -> AsyncIterator[Operator]:
    (tmp_path / "slow_operator.py").write_text(FACTORY)
    probes = free_port()
    log = tmp_path / "operator.log"
    target = f"{tmp_path / 'slow_operator.py'}:factory"
    env = environment(plane, tmp_path, namespace)
    process = await spawn_run(target, probes, log, env, "--log-format", "json", *flags)
    running = Operator(process, probes, tmp_path, log)
    try:
        yield running
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()


async def probe_ok(port: int, path: str) -> bool:
    answer = await asyncio.to_thread(http_get, port, path)
    return answer is not None and answer[0] == 200


@asynccontextmanager
async def operator_on_hub(
    fleet: Fleet, tmp_path: Path, *flags: str
) -> AsyncIterator[tuple[Operator, mcr.Cluster, str]]:
    """The operator of FACTORY with ``flags``, its hub cluster, and the namespace it watches."""
    plane = fleet["cluster-1"]
    async with running_cluster(plane, "hub") as hub:
        namespace = await new_namespace(hub, "cli")
        async with operator(plane, tmp_path, namespace, *flags) as op:
            yield op, hub, namespace


async def slow_reconcile_started(op: Operator, hub: mcr.Cluster, namespace: str) -> None:
    """Once the operator is ready, create ConfigMap "slow" and wait until its reconcile has begun."""
    await wait_for(lambda: probe_ok(op.probes, "/readyz"), timeout=60)
    await hub.client.create(
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "slow"}}, namespace=namespace
    )
    await wait_for(lambda: (op.work / "started").exists(), timeout=60)


async def test_run_serves_probes_and_drains_in_flight_work_on_sigterm(fleet: Fleet, tmp_path: Path) -> None:
    plane = fleet["cluster-1"]
    async with running_cluster(plane, "hub") as hub:
        namespace = await new_namespace(hub, "cli")
        lease = unique("cli-leader")
        flags = ("--leader-election", "--leader-election-id", lease, "--leader-election-namespace", namespace)
        async with operator(plane, tmp_path, namespace, *flags, "--graceful-shutdown-timeout", "20") as op:
            await wait_for(lambda: probe_ok(op.probes, "/healthz"), timeout=60)
            await slow_reconcile_started(op, hub, namespace)
            op.process.send_signal(signal.SIGTERM)
            (tmp_path / "proceed").touch()
            code = await op.exit_code(timeout=20 + 10 + 5)
            log = await op.stderr()
        assert code == 0, log
        assert "received SIGTERM" in log
        finished = await hub.client.get(CONFIGMAP, "slow", namespace=namespace)
        assert finished["metadata"]["annotations"] == {"cli-test/finished": "yes"}
        released = await hub.client.get(LEASE, lease, namespace=namespace)
        assert released["spec"]["holderIdentity"] == ""


async def test_run_on_uvloop_reconciles_writes_and_drains(fleet: Fleet, tmp_path: Path) -> None:
    async with operator_on_hub(fleet, tmp_path, "--event-loop", "uvloop") as (op, hub, namespace):
        await slow_reconcile_started(op, hub, namespace)
        loop_module = (tmp_path / "started").read_text()
        op.process.send_signal(signal.SIGTERM)
        (tmp_path / "proceed").touch()
        code = await op.exit_code(timeout=30 + 10 + 5)
        assert code == 0, await op.stderr()
        assert loop_module.startswith("uvloop"), loop_module
        finished = await hub.client.get(CONFIGMAP, "slow", namespace=namespace)
        assert finished["metadata"]["annotations"] == {"cli-test/finished": "yes"}


async def test_a_drain_that_hits_its_bound_exits_3(fleet: Fleet, tmp_path: Path) -> None:
    async with operator_on_hub(fleet, tmp_path, "--graceful-shutdown-timeout", "1") as (op, hub, namespace):
        await slow_reconcile_started(op, hub, namespace)
        op.process.send_signal(signal.SIGTERM)  # and the reconcile never gets to proceed
        code = await op.exit_code(timeout=1 + 10 + 5)
        log = await op.stderr()
    assert code == 3, log
    assert "did not finish within 1s" in log
    # What was cut is named, and the run's last line says how it ended.
    assert f"cancelling 1 reconcile still running after 1s: (local):{namespace}/slow" in log, log
    last = log.strip().splitlines()[-1]
    assert "stopped; reconciles still running after the 1s drain were cancelled (exit code 3)" in last, log


async def test_a_second_signal_stops_at_once_and_exits_3(fleet: Fleet, tmp_path: Path) -> None:
    async with operator_on_hub(fleet, tmp_path, "--graceful-shutdown-timeout", "600") as (op, hub, namespace):
        await slow_reconcile_started(op, hub, namespace)
        op.process.send_signal(signal.SIGINT)
        await wait_for(lambda: "stopping gracefully" in op.log.read_text(), timeout=30)
        op.process.send_signal(signal.SIGINT)
        code = await op.exit_code(timeout=30)  # far inside the 600 s drain it would have had
        log = await op.stderr()
    assert code == 3, log
    assert "received SIGINT again" in log


THREADED = """
import asyncio
import time

import mcruntime as mcr


class Sleeper:
    async def start(self) -> None:
        await asyncio.to_thread(time.sleep, 600)  # a thread nothing can cancel


def factory(settings: mcr.ManagerSettings) -> mcr.Manager:
    manager = mcr.Manager.from_settings(local=mcr.load_kubeconfig_env(), settings=settings)
    manager.add(Sleeper())
    return manager
"""


async def test_a_thread_that_sleeps_on_does_not_hold_the_process_after_the_drain(
    fleet: Fleet, tmp_path: Path
) -> None:
    (tmp_path / "threaded.py").write_text(THREADED)
    probes = free_port()
    env = environment(fleet["cluster-1"], tmp_path, "default")
    log = tmp_path / "threaded.log"
    target = f"{tmp_path / 'threaded.py'}:factory"
    process = await spawn_run(target, probes, log, env, "--graceful-shutdown-timeout", "1")
    try:
        await wait_for(lambda: probe_ok(probes, "/readyz"), timeout=60)
        process.send_signal(signal.SIGTERM)
        code = await asyncio.wait_for(process.wait(), 120)  # the thread sleeps 600 s
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    text = log.read_text()
    assert code == 0, text
    assert "stopped cleanly" in text
    assert "threads still run 5s later (" in text and "asyncio_" in text  # the executor's thread, named


async def test_check_builds_and_describes_the_manager_without_connecting(tmp_path: Path) -> None:
    (tmp_path / "slow_operator.py").write_text(FACTORY)
    unreachable = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}],
        "users": [{"name": "u", "user": {"token": "never-sent"}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "c",
    }
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(mcr_yaml(unreachable))
    kubeconfig.chmod(0o600)
    env = {name: value for name, value in os.environ.items() if not name.startswith("MCRUNTIME_")}
    env.update(KUBECONFIG=str(kubeconfig), CLI_TEST_DIR=str(tmp_path), CLI_TEST_NAMESPACE="default")
    code, out, err = await mcruntime("run", f"{tmp_path / 'slow_operator.py'}:factory", "--check", env=env)
    assert (code, err) == (0, ""), err
    assert out.splitlines() == [
        "provider: none (local cluster only)",
        "controller slow: watches ConfigMap (v1) in the hub",
        "metrics: :8080",
        "probes: :8081",
        f"ok: {tmp_path / 'slow_operator.py'}:factory",
    ]


async def test_a_broken_factory_path_exits_2_with_one_line(tmp_path: Path) -> None:
    path = tmp_path / "slow_operator.py"
    path.write_text(FACTORY)
    env = {**os.environ, "CLI_TEST_DIR": str(tmp_path)}
    code, _, err = await mcruntime("run", f"{path}:fatcory", env=env)
    assert code == 2
    assert err.splitlines() == [f"mcruntime run: error: module '{path}' has no attribute 'fatcory'"]


async def test_an_unimportable_module_exits_2_naming_it() -> None:
    code, _, err = await mcruntime("run", "no_such_operator.module:factory")
    assert code == 2
    assert err.splitlines() == [
        "mcruntime run: error: cannot import module 'no_such_operator.module': "
        "ModuleNotFoundError: No module named 'no_such_operator'"
    ]


@pytest.mark.parametrize(
    ("flags", "variables", "named"),
    [
        (["--lease-duration", "soon"], {}, "--lease-duration 'soon'"),
        ([], {"MCRUNTIME_READY_MIN_SHARE": "2"}, "MCRUNTIME_READY_MIN_SHARE='2'"),
    ],
    ids=["flag", "variable"],
)
async def test_a_bad_setting_exits_2_naming_the_flag_or_variable(
    flags: list[str], variables: dict[str, str], named: str
) -> None:
    env = {name: value for name, value in os.environ.items() if not name.startswith("MCRUNTIME_")}
    env.update(variables)
    code, _, err = await mcruntime("run", "never_imported:factory", *flags, env=env)
    assert code == 2
    [line] = err.splitlines()
    assert line.startswith(f"mcruntime run: error: invalid settings: {named}: ")


async def test_python_dash_m_and_the_console_script_agree() -> None:
    code, out, _ = await mcruntime("--version")
    assert (code, out.strip()) == (0, f"mcruntime {mcr.__version__}")
    script = Path(sys.executable).parent / "mcruntime"
    process = await asyncio.create_subprocess_exec(str(script), "--version", stdout=asyncio.subprocess.PIPE)
    stdout, _ = await process.communicate()
    assert (process.returncode, stdout.decode().strip()) == (0, f"mcruntime {mcr.__version__}")


def mcr_yaml(data: object) -> str:
    import yaml

    return yaml.safe_dump(data)
