"""Exec credential plugins: our runner, single-flight, refreshed, bounded, killed with the cluster.

The plugin is a small Python script written by each test: it appends a line to
a run log (so runs can be counted), records its pid and ``KUBERNETES_EXEC_INFO``,
optionally starts a child and sleeps, and prints the token read from a file.
"""

from __future__ import annotations

import asyncio
import datetime
import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest
from kube_helpers import NAMESPACE

import mcruntime as mcr
from mcruntime._config import exec as exec_module
from mcruntime._config.credentials import ClusterCredentials
from mcruntime._config.exec import ExecPlugin, ExecPluginError, _reap
from mcruntime.testing import ControlPlane, Fleet, wait_until

API = "client.authentication.k8s.io/v1"

PLUGIN = """#!{python}
import json, os, subprocess, sys, time
here = os.path.dirname(os.path.abspath(__file__))
def read(name, default=""):
    try:
        with open(os.path.join(here, name)) as f:
            return f.read().strip()
    except OSError:
        return default
with open(os.path.join(here, "runs"), "a") as f:
    f.write(str(os.getpid()) + "\\n")
with open(os.path.join(here, "exec-info"), "w") as f:
    f.write(os.environ.get("KUBERNETES_EXEC_INFO", ""))
if read("child"):
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    # Whole or absent: the test reads it as soon as it exists (os.replace is atomic).
    with open(os.path.join(here, "child-pid.part"), "w") as f:
        f.write(str(child.pid))
    os.replace(os.path.join(here, "child-pid.part"), os.path.join(here, "child-pid"))
time.sleep(float(read("sleep", "0")))
if read("fail"):
    print("the token was " + read("token"))
    sys.stderr.write("made-up failure\\n")
    sys.exit(3)
tokens = read("token").split()
run = len(read("runs").split())
token = tokens[min(run, len(tokens)) - 1]
status = {{"token": token}}
if read("expires"):
    status["expirationTimestamp"] = read("expires")
print(read("prefix") + json.dumps({{"apiVersion": "{api}", "kind": "ExecCredential", "status": status}}))
"""


def write_plugin(directory: Path, *tokens: str, **files: str) -> Path:
    """The plugin script in ``directory``, with its control files."""
    directory.mkdir(parents=True, exist_ok=True)
    script = directory / "plugin.py"
    script.write_text(PLUGIN.format(python=sys.executable, api=API))
    script.chmod(0o700)
    (directory / "token").write_text(" ".join(tokens))
    for name, value in files.items():
        (directory / name).write_text(value)
    return script


def runs(directory: Path) -> list[int]:
    path = directory / "runs"
    return [int(pid) for pid in path.read_text().split()] if path.exists() else []


def exec_kubeconfig(plane: ControlPlane, script: Path, **extra: Any) -> mcr.ClusterConfig:
    data = plane.kubeconfig()
    data["users"][0]["user"] = {
        "exec": {"apiVersion": API, "command": str(script), "interactiveMode": "Never", **extra}
    }
    return mcr.kubeconfig_from_dict(data, trust=mcr.TrustPolicy(allow_exec=True), origin="exec test")


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie waiting for its parent to reap it has ended too
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


async def test_concurrent_requests_share_one_plugin_run(fleet: Fleet, tmp_path: Path) -> None:
    plane = fleet["cluster-1"]
    user = plane.add_token_user("exec-single-flight")
    assert user.token is not None
    script = write_plugin(tmp_path, user.token, sleep="0.5")
    cluster = mcr.Cluster("exec-single", exec_kubeconfig(plane, script, provideClusterInfo=True))
    async with cluster:
        replies = await asyncio.gather(*(cluster.client.list(NAMESPACE) for _ in range(10)))

    assert all(reply.items for reply in replies)
    assert len(runs(tmp_path)) == 1
    info = json.loads((tmp_path / "exec-info").read_text())
    assert info["apiVersion"] == API
    assert info["spec"]["interactive"] is False
    assert info["spec"]["cluster"]["server"] == plane.server


async def test_a_rejected_credential_runs_the_plugin_again(fleet: Fleet, tmp_path: Path) -> None:
    plane = fleet["cluster-1"]
    user = plane.add_token_user("exec-refresh")
    assert user.token is not None
    # The first run prints a token the server rejects; the second the real one.
    script = write_plugin(tmp_path, "made-up-rejected-token", user.token)
    async with mcr.Cluster("exec-401", exec_kubeconfig(plane, script)) as cluster:
        reply = await cluster.client.list(NAMESPACE)

    assert reply.items
    assert len(runs(tmp_path)) == 2


async def test_a_credential_about_to_expire_is_refreshed_before_use(tmp_path: Path) -> None:
    expired = (datetime.datetime.now(datetime.UTC) - datetime.timedelta(seconds=1)).isoformat()
    later = (datetime.datetime.now(datetime.UTC) + datetime.timedelta(hours=1)).isoformat()
    script = write_plugin(tmp_path, "made-up-a", "made-up-b", expires=expired)
    config = mcr.kubeconfig_from_dict(
        {
            "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}],
            "users": [{"name": "u", "user": {"exec": {"apiVersion": API, "command": str(script)}}}],
            "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
            "current-context": "x",
        },
        trust=mcr.TrustPolicy(allow_exec=True),
    )
    credentials = ClusterCredentials(config, "expiry")

    assert await credentials.header() == "Bearer made-up-a"
    (tmp_path / "expires").write_text(later)
    assert await credentials.header() == "Bearer made-up-b"  # the first had expired: run again
    assert await credentials.header() == "Bearer made-up-b"  # valid for an hour: no run
    assert len(runs(tmp_path)) == 2
    await credentials.close()


async def test_stopping_the_cluster_kills_a_slow_plugin_and_its_children(
    fleet: Fleet, tmp_path: Path
) -> None:
    plane = fleet["cluster-2"]
    script = write_plugin(tmp_path, "made-up-never-used", sleep="120", child="yes")
    cluster = mcr.Cluster("exec-slow", exec_kubeconfig(plane, script))
    await cluster.start()
    requests = [asyncio.create_task(cluster.transport.request("GET", "/api/v1/namespaces")) for _ in range(3)]
    await wait_until(lambda: (tmp_path / "child-pid").exists(), timeout=20, what="the plugin started a child")
    plugin_pid = runs(tmp_path)[0]
    child_pid = int((tmp_path / "child-pid").read_text())
    assert alive(plugin_pid) and alive(child_pid)

    await cluster.stop()

    for request in requests:
        with pytest.raises(mcr.Unreachable):
            await request
    await wait_until(lambda: not alive(plugin_pid) and not alive(child_pid), timeout=10, what="plugin killed")
    assert len(runs(tmp_path)) == 1  # three waiting requests, one run


async def run_plugin(directory: Path, timeout: float = 10, max_output: int = 4096, **files: str) -> Any:
    script = write_plugin(directory, "made-up-secret-token-77e1", **files)
    plugin = ExecPlugin(
        {"apiVersion": API, "command": str(script)},
        cluster="c1",
        server="https://h",
        timeout=timeout,
        max_output=max_output,
    )
    return await plugin.run()


async def test_a_plugin_credential_is_parsed_and_never_shown(tmp_path: Path) -> None:
    credential = await run_plugin(tmp_path, expires="2030-01-02T03:04:05Z")

    assert credential.token == "made-up-secret-token-77e1"
    assert credential.expires == datetime.datetime(2030, 1, 2, 3, 4, 5, tzinfo=datetime.UTC)
    assert "made-up-secret-token-77e1" not in repr(credential)


@pytest.mark.parametrize(
    ("files", "message"),
    [
        ({"fail": "yes"}, "exited with status 3: made-up failure"),
        ({"prefix": "x" * 5000}, "printed more than 4096 bytes on stdout"),
        ({"prefix": "not json "}, "did not print an ExecCredential"),
        ({"sleep": "30"}, "did not finish within 0.5 s and was killed"),
        ({"expires": "soon"}, "expirationTimestamp is not an RFC 3339 time"),
    ],
)
async def test_a_failing_plugin_gets_an_error_naming_cluster_and_plugin_without_the_credential(
    tmp_path: Path, files: dict[str, str], message: str
) -> None:
    with pytest.raises(ExecPluginError) as caught:
        await run_plugin(tmp_path, 0.5 if "sleep" in files else 10, 4096, **files)

    assert message in str(caught.value)
    assert "c1" in str(caught.value) and "plugin.py" in str(caught.value)
    assert "made-up-secret-token-77e1" not in str(caught.value)
    # The runner reaps its plugin before returning: not even a zombie is left for the
    # garbage collector to find after the event loop has closed.
    assert [pid for pid in runs(tmp_path) if Path(f"/proc/{pid}").exists()] == []


class KilledPlugin:
    """A SIGKILLed plugin whose exit is still on its way: it is reported when the test says so."""

    def __init__(self) -> None:
        self.returncode: int | None = None
        self.reported = asyncio.Event()
        self.asked = asyncio.Event()
        self.pipes_closed = False
        self._transport = self

    async def wait(self) -> int:
        self.asked.set()
        await self.reported.wait()
        self.returncode = -9
        return self.returncode

    def close(self) -> None:
        self.pipes_closed = True


async def test_reaping_a_killed_plugin_outlasts_further_cancellations_then_passes_them_on() -> None:
    plugin = KilledPlugin()
    reaping = asyncio.create_task(_reap(plugin))  # type: ignore[arg-type]
    await plugin.asked.wait()
    for _ in range(3):  # the request's deadline, the cluster stopping, the event loop closing
        reaping.cancel()
        for _ in range(5):
            await asyncio.sleep(0)  # turns of the loop, for the cancellation to arrive
        assert not reaping.done() and not plugin.pipes_closed
    plugin.reported.set()
    with pytest.raises(asyncio.CancelledError):
        await reaping
    assert plugin.pipes_closed


async def test_a_plugin_whose_exit_never_comes_has_its_pipes_closed_after_the_limit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(exec_module, "_REAP_TIMEOUT", 0.2)
    plugin = KilledPlugin()
    await _reap(plugin)  # type: ignore[arg-type]
    assert plugin.pipes_closed and not plugin.reported.is_set()


async def test_a_missing_plugin_program_is_reported_with_its_install_hint(tmp_path: Path) -> None:
    plugin = ExecPlugin(
        {"apiVersion": API, "command": "made-up-missing-helper", "installHint": "install made-up-helper"},
        cluster="c1",
        server="https://h",
    )

    with pytest.raises(
        ExecPluginError,
        match=r"not found or not executable \(tried made-up-missing-helper on PATH\); install made-up-helper",
    ):
        await plugin.run()
    assert plugin.runs == 0


async def test_shutting_the_manager_down_kills_a_slow_plugin(fleet: Fleet, tmp_path: Path) -> None:
    script = write_plugin(tmp_path, "made-up-never-used", sleep="120", child="yes")
    provider = mcr.StaticProvider({"slow": exec_kubeconfig(fleet["cluster-3"], script)})
    manager = mcr.Manager(provider, handle_signals=False, graceful_shutdown_timeout=5)
    mcr.controller_managed_by(manager).named("exec-shutdown").for_(NAMESPACE).complete(_nothing)
    task = asyncio.create_task(manager.start())
    await wait_until(lambda: (tmp_path / "child-pid").exists(), timeout=30, what="the plugin started a child")
    plugin_pid, child_pid = runs(tmp_path)[0], int((tmp_path / "child-pid").read_text())

    manager.stop()  # what the SIGTERM handler does
    await task

    await wait_until(lambda: not alive(plugin_pid) and not alive(child_pid), timeout=10, what="plugin killed")
    assert len(runs(tmp_path)) == 1


async def _nothing(_request: mcr.Request) -> None:
    return None
