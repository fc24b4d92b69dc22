"""KindProvider against a stand-in ``kind`` whose clusters are real testbed control planes.

No container runtime exists where these tests run, so each test writes a tiny
``kind`` executable of its own (``kind_standin.py``) into ``tmp_path`` and puts
it first on ``PATH`` (the ``kind`` fixture, ``conftest.py``).
It answers ``kind get clusters`` and ``kind get kubeconfig --name X
[--internal]`` with kind's output format, messages and exit codes, from a JSON
state file the test edits: which clusters exist, which kubeconfig each one's
control plane holds (a testbed ``ControlPlane``'s), whether the container
runtime is up, whether a kubeconfig is readable yet. Everything after discovery
(parsing, engaging, probing, reconciling) is real.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from kind_standin import FakeKind

import mcruntime as mcr
from mcruntime.testing import Fleet
from mcruntime.testing.conformance import CLUSTER_OPTIONS, PROBE_INTERVAL, Target, wait_until
from mcruntime_kind import (
    LISTING,
    NO_CLUSTERS,
    KindCLI,
    KindCommandError,
    KindProvider,
    KindSettings,
    context_name,
)
from mcruntime_kind import _cli as kind_cli
from mcruntime_kind._cli import _kill

POLL = 0.1
"""Poll interval of every provider under test: changes show within a few tenths of a second."""

CONFIGMAP = mcr.Kind("v1", "ConfigMap")


def provider(**kwargs: Any) -> KindProvider:
    kwargs.setdefault("poll_interval", POLL)
    kwargs.setdefault("options", CLUSTER_OPTIONS)
    kwargs.setdefault("probe_interval", PROBE_INTERVAL)
    return KindProvider(**kwargs)


@asynccontextmanager
async def running(provider: KindProvider) -> AsyncIterator[mcr.Manager]:
    """Run ``provider`` in a manager; afterwards every cluster it engaged must be stopped."""
    manager = mcr.Manager(provider, handle_signals=False)
    engaged: list[mcr.Cluster] = []

    class Recorder:
        async def engage(self, name: str, cluster: mcr.Cluster) -> None:
            engaged.append(cluster)

    manager.add(Recorder())
    runner = asyncio.create_task(manager.start())
    try:
        await wait_until(lambda: provider.polls > 0 or runner.done(), what="the first poll")
        if runner.done():
            runner.result()
        yield manager
    finally:
        manager.stop()
        await runner
    for cluster in engaged:
        assert cluster.stopped and len(cluster.tasks) == 0 and cluster.transport.closed


def recovered(provider: KindProvider) -> bool:
    return listing_error(provider) is None


def listing_error(provider: KindProvider) -> str | None:
    """Why the last listing failed, as every provider reports a source: ``None`` when it worked."""
    return provider.sources()[LISTING].error


def kubeconfig_errors(provider: KindProvider) -> dict[str, str]:
    """Listed clusters whose kubeconfig could not be used, read off their sources."""
    return {
        name: source.error
        for name, source in provider.sources().items()
        if source.cluster is not None and source.error is not None
    }


async def released(cluster: mcr.Cluster) -> None:
    """Wait until a disengaged cluster has finished stopping: no task, connections closed.

    The manager forgets a cluster as its stop begins; closing connections comes last.
    """
    await wait_until(
        lambda: cluster.stopped and len(cluster.tasks) == 0 and cluster.transport.closed,
        what=f"cluster {cluster.name!r} released",
    )


def engaged(manager: mcr.Manager) -> set[str]:
    return {name for name in manager.clusters() if name != mcr.LOCAL_CLUSTER}


async def ready(provider: KindProvider, name: str) -> mcr.Cluster:
    """Wait until ``name`` is engaged and answers; return the cluster."""

    def answered() -> bool:
        status = provider.statuses().get(name)
        return status is not None and status.phase is mcr.ClusterPhase.READY

    await wait_until(answered, what=f"kind cluster {name!r} engaged and ready")
    return await provider.get(name)


# --- the stand-in itself speaks kind ---------------------------------------------------------


async def test_the_cli_reads_kinds_outputs_and_failures(kind: FakeKind, fleet: Fleet) -> None:
    cli = KindCLI()  # "kind" from PATH: the stand-in
    assert await cli.clusters() == []
    plane = fleet["cluster-1"]
    kind.create("beta", plane.kubeconfig())
    kind.create("alpha", plane.kubeconfig())
    assert await cli.clusters() == ["alpha", "beta"]
    text = await cli.kubeconfig("alpha")
    assert f'current-context: "{context_name("alpha")}"' in text
    with pytest.raises(KindCommandError) as missing:
        await cli.kubeconfig("gamma")
    assert missing.value.exit_code == 1
    assert str(missing.value) == (
        "`kind get kubeconfig --name gamma` failed with exit code 1: ERROR: could not locate any control "
        "plane nodes for cluster named 'gamma'. Use the --name option to select a different cluster"
    )
    kind.runtime(up=False)
    with pytest.raises(KindCommandError) as down:
        await cli.clusters()
    assert down.value.command == "kind get clusters" and down.value.exit_code == 1
    assert (
        "failed to list clusters" in down.value.detail
        and "Cannot connect to the Docker daemon" in down.value.detail
    )
    with pytest.raises(KindCommandError, match="could not run: no kind executable"):
        await KindCLI(str(kind.bin / "no-such-kind")).clusters()


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True  # killed and reaped: not even a zombie is left
    return False


def ended(pid: int) -> bool:
    """Gone, or a zombie: a grandchild is reaped by whoever adopted it, not by us."""
    try:
        return gone(pid) or Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"
    except OSError:
        return True


def hanging(kind: FakeKind) -> tuple[int, int] | None:
    """The hanging kind's pid and its runtime child's, once it has written them."""
    try:
        kind_pid, runtime_pid = kind.pid_path.read_text().split()
    except (OSError, ValueError):
        return None
    return int(kind_pid), int(runtime_pid)


async def test_a_hanging_kind_is_killed_on_timeout_and_on_cancellation(kind: FakeKind) -> None:
    kind.hang()
    with pytest.raises(KindCommandError, match=r"did not finish within 0\.5s; killed it") as slow:
        await KindCLI(timeout=0.5).clusters()
    assert slow.value.exit_code is None
    pids = hanging(kind)
    assert pids is not None
    assert gone(pids[0])  # kind itself is reaped before the error is raised
    # The runtime child held the pipes open: it is killed too. The group's SIGKILL is sent
    # before the error is raised; the child's exit then follows when the kernel runs it.
    runtime = pids[1]
    await wait_until(lambda: ended(runtime), what="kind's runtime child ended after the timeout")
    kind.pid_path.unlink()
    listing = asyncio.create_task(KindCLI().clusters())
    await wait_until(lambda: hanging(kind) is not None, what="kind started")
    listing.cancel()
    with pytest.raises(asyncio.CancelledError):
        await listing
    pids = hanging(kind)
    assert pids is not None
    assert gone(pids[0])
    runtime = pids[1]
    await wait_until(lambda: ended(runtime), what="kind's runtime child ended after the cancellation")


class Exiting:
    """A kind being killed: its exit is reported when the test says so."""

    def __init__(self) -> None:
        self.pid = int(Path("/proc/sys/kernel/pid_max").read_text()) + 1  # no process group has it
        self.returncode: int | None = None
        self.killed = False
        self.exit = asyncio.Event()
        self.waiting = asyncio.Event()
        self.closed = False
        self._transport = self

    def kill(self) -> None:
        self.killed = True

    async def wait(self) -> int:
        self.waiting.set()
        await self.exit.wait()
        self.returncode = -9
        return self.returncode

    def close(self) -> None:
        self.closed = True


async def test_a_cancellation_while_kind_is_collected_waits_for_it_then_goes_on() -> None:
    process = Exiting()
    killing = asyncio.create_task(_kill(process))  # type: ignore[arg-type]
    await process.waiting.wait()
    assert process.killed
    for _ in range(3):  # a shutdown, then the event loop closing, then once more
        killing.cancel()
        for _ in range(5):
            await asyncio.sleep(0)  # turns of the loop, for the cancellation to arrive
        assert not killing.done() and not process.closed
    process.exit.set()
    with pytest.raises(asyncio.CancelledError):
        await killing
    assert process.closed  # its pipes closed by us, not by the garbage collector later


async def test_a_kind_that_never_reports_its_exit_is_given_up_on_with_its_pipes_closed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(kind_cli, "_REAP_LIMIT", 0.2)
    process = Exiting()
    await _kill(process)  # type: ignore[arg-type]
    assert process.closed and not process.exit.is_set()


async def test_no_kind_clusters_found_is_zero_clusters_not_an_error(kind: FakeKind) -> None:
    process = await asyncio.create_subprocess_exec(
        "kind", "get", "clusters", stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    stdout, stderr = await process.communicate()
    assert (process.returncode, stdout, stderr.decode().strip()) == (0, b"", NO_CLUSTERS)
    kind_provider = provider()
    async with running(kind_provider) as manager:
        await kind_provider.next_poll()
        assert listing_error(kind_provider) is None and kind_provider.listed() == []
        assert engaged(manager) == set() and kind_provider.statuses() == {}


# --- discovery ---------------------------------------------------------------------------------


async def test_clusters_appear_and_disappear_under_their_kind_names(kind: FakeKind, fleet: Fleet) -> None:
    first, second = fleet["cluster-1"], fleet["cluster-2"]
    kind.create("alpha", first.kubeconfig())
    kind_provider = provider()
    async with running(kind_provider) as manager:
        alpha = await ready(kind_provider, "alpha")
        assert alpha.config.server == first.server
        assert await manager.get_cluster("alpha") is alpha
        with pytest.raises(mcr.ClusterNotFound):
            await kind_provider.get(context_name("alpha"))  # "kind-alpha" is the context, not the name
        kind.create("beta", second.kubeconfig())
        beta = await ready(kind_provider, "beta")
        assert beta.config.server == second.server
        assert engaged(manager) == {"alpha", "beta"}
        kind.delete("alpha")
        await wait_until(lambda: engaged(manager) == {"beta"}, what="alpha disengaged")
        await released(alpha)
        with pytest.raises(mcr.ClusterNotFound):
            await kind_provider.get("alpha")
        assert await kind_provider.get("beta") is beta and not beta.stopped
        assert listing_error(kind_provider) is None


async def test_a_cluster_recreated_under_the_same_name_is_re_engaged(kind: FakeKind, fleet: Fleet) -> None:
    before, after = fleet["cluster-1"], fleet["cluster-3"]  # another CA, another port
    kind.create("dev", before.kubeconfig())
    kind_provider = provider()
    async with running(kind_provider) as manager:
        old = await ready(kind_provider, "dev")
        assert old.config.server == before.server
        for _poll in range(2):  # the same kubeconfig poll after poll: nothing happens
            await kind_provider.next_poll()
        assert await kind_provider.get("dev") is old and kind_provider.statuses()["dev"].engagements == 1
        kind.delete("dev")
        kind.create("dev", after.kubeconfig())  # deleted and recreated between two polls
        await wait_until(
            lambda: manager.clusters().get("dev") not in (None, old),
            what="dev re-engaged with its new config",
        )
        new = await ready(kind_provider, "dev")
        assert new.config.server == after.server
        await released(old)
        assert kind_provider.statuses()["dev"].engagements == 2


async def test_a_runtime_down_is_a_retried_error_and_engaged_clusters_stay(
    kind: FakeKind, fleet: Fleet
) -> None:
    first, second = fleet["cluster-1"], fleet["cluster-2"]
    kind.create("alpha", first.kubeconfig())
    kind_provider = provider()
    async with running(kind_provider) as manager:
        alpha = await ready(kind_provider, "alpha")
        kind.runtime(up=False)
        await wait_until(lambda: listing_error(kind_provider) is not None, what="the runtime reported down")
        error = listing_error(kind_provider)
        assert error is not None
        assert error.startswith("`kind get clusters` failed with exit code 1: ERROR: failed to list clusters")
        assert "Is the docker daemon running?" in error
        failed_polls = kind_provider.polls
        await kind_provider.next_poll()  # retried, and still failing
        assert kind_provider.polls > failed_polls and listing_error(kind_provider) == error
        assert engaged(manager) == {"alpha"} and manager.clusters()["alpha"] is alpha and not alpha.stopped
        kind.create("beta", second.kubeconfig())  # created while kind could not be asked
        kind.runtime(up=True)
        beta = await ready(kind_provider, "beta")
        assert beta.config.server == second.server
        assert recovered(kind_provider)  # mypy: the property changed since it was last read
        assert manager.clusters()["alpha"] is alpha and kind_provider.statuses()["alpha"].engagements == 1


async def test_a_missing_kind_binary_is_reported_and_retried(tmp_path: Path, fleet: Fleet) -> None:
    fake = FakeKind(tmp_path)  # not on PATH: the provider is given a path that does not exist yet
    fake.create("alpha", fleet["cluster-1"].kubeconfig())
    binary = tmp_path / "later" / "kind"
    kind_provider = provider(binary=str(binary))
    async with running(kind_provider) as manager:
        await wait_until(lambda: listing_error(kind_provider) is not None, what="the missing binary reported")
        assert listing_error(kind_provider) == (
            f"`kind get clusters` could not run: no kind executable {str(binary)!r} "
            "(install kind, or point the provider's `binary` option or MCRUNTIME_KIND_BINARY at it)"
        )
        assert engaged(manager) == set()
        binary.parent.mkdir()
        fake.install(binary)  # kind installed while the provider runs
        await ready(kind_provider, "alpha")
        assert listing_error(kind_provider) is None


async def test_discovery_survives_5000_consecutive_failures_at_its_capped_delay(tmp_path: Path) -> None:
    chosen: list[float] = []

    class Recording(mcr.Backoff):
        def delay(self, failures: int) -> float:
            chosen.append(mcr.Backoff(base=2.0, cap=30.0, jitter=0.2).delay(failures))
            return 0.0

    kind_provider = provider(binary=str(tmp_path / "never" / "kind"), backoff=Recording())
    logging.getLogger("mcruntime.providers.kind").disabled = True
    try:
        async with running(kind_provider):
            await wait_until(lambda: len(chosen) >= 5000, timeout=120, what="5,000 failed polls")
            assert "no kind executable" in (listing_error(kind_provider) or "")
    finally:
        logging.getLogger("mcruntime.providers.kind").disabled = False
    assert max(chosen) <= 30.0 and min(chosen[-1000:]) >= 24.0  # at its cap, jittered by a fifth


async def test_a_kubeconfig_not_readable_yet_is_retried_neither_engaged_nor_removed(
    kind: FakeKind, fleet: Fleet
) -> None:
    first, second = fleet["cluster-1"], fleet["cluster-2"]
    kind.create("ready", first.kubeconfig())
    kind.create("creating", second.kubeconfig(), readable=False)  # listed, no admin.conf yet
    kind_provider = provider()
    async with running(kind_provider) as manager:
        engaged_ready = await ready(kind_provider, "ready")
        await wait_until(lambda: "creating" in kubeconfig_errors(kind_provider), what="creating reported")
        assert kubeconfig_errors(kind_provider)["creating"].startswith(
            "`kind get kubeconfig --name creating` failed with exit code 1: "
            "ERROR: failed to get cluster internal kubeconfig"
        )
        assert kind_provider.listed() == ["creating", "ready"]
        assert engaged(manager) == {"ready"}
        kind.readable("creating", True)
        creating = await ready(kind_provider, "creating")
        assert creating.config.server == second.server and kubeconfig_errors(kind_provider) == {}

        kind.readable("ready", False)  # its container stopped, say: unavailable, not gone
        await wait_until(lambda: "ready" in kubeconfig_errors(kind_provider), what="ready reported")
        await kind_provider.next_poll()
        assert manager.clusters()["ready"] is engaged_ready and not engaged_ready.stopped
        kind.delete("ready")  # only the listing says "gone"
        await wait_until(lambda: engaged(manager) == {"creating"}, what="ready disengaged")
        await released(engaged_ready)
        assert kubeconfig_errors(kind_provider) == {}


async def test_prefix_and_allow_list_select_clusters(kind: FakeKind, fleet: Fleet) -> None:
    plane = fleet["cluster-1"]
    for name in ("dev-a", "dev-b", "capi-workload"):
        kind.create(name, plane.kubeconfig())
    prefixed = provider(prefix="dev-")
    async with running(prefixed) as manager:
        await ready(prefixed, "dev-a")
        await ready(prefixed, "dev-b")
        await prefixed.next_poll()
        assert engaged(manager) == {"dev-a", "dev-b"} and prefixed.listed() == ["dev-a", "dev-b"]
    allowed = provider(clusters=["dev-b", "capi-workload", "not-there"])
    async with running(allowed) as manager:
        await ready(allowed, "dev-b")
        await ready(allowed, "capi-workload")
        await allowed.next_poll()
        assert engaged(manager) == {"dev-b", "capi-workload"}
        kind.create("not-there", plane.kubeconfig())
        await ready(allowed, "not-there")


async def test_internal_mode_asks_kind_for_the_in_network_endpoint(kind: FakeKind, fleet: Fleet) -> None:
    kind.create("alpha", fleet["cluster-1"].kubeconfig())
    kind_provider = provider(internal=True)
    async with running(kind_provider) as manager:
        await wait_until(lambda: "alpha" in manager.clusters(), what="alpha engaged")
        assert manager.clusters()["alpha"].config.server == "https://alpha-control-plane:6443"
        # No kind network here: the name does not resolve, so the cluster is unhealthy, and kept.
        await wait_until(
            lambda: kind_provider.statuses()["alpha"].phase is mcr.ClusterPhase.UNHEALTHY,
            what="alpha unhealthy",
        )


async def test_nothing_of_a_kubeconfig_reaches_logs_errors_or_reprs(
    kind: FakeKind, fleet: Fleet, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="mcruntime")
    plane = fleet["cluster-2"]
    token = plane.token_user.token
    assert token is not None
    refused = Target.of(plane).kubeconfig()  # a token user: the untrusted policy refuses insecure TLS
    refused["clusters"][0]["cluster"]["insecure-skip-tls-verify"] = True
    kind.create("refused", refused)
    kind.create("fine", Target.of(plane).kubeconfig())
    kind_provider = provider()
    async with running(kind_provider) as manager:
        await ready(kind_provider, "fine")
        await wait_until(lambda: "refused" in kubeconfig_errors(kind_provider), what="refused reported")
        assert "trust policy refuses" in kubeconfig_errors(kind_provider)["refused"]
        assert "kind cluster 'refused'" in kubeconfig_errors(kind_provider)["refused"]
        assert engaged(manager) == {"fine"}
        failed = kind_provider.statuses()["refused"]  # never engaged: failed, with its source
        assert failed.phase is mcr.ClusterPhase.FAILED and failed.source == kind_provider.sources()["refused"]
        exposed = (
            caplog.text
            + repr(kind_provider)
            + repr(kind_provider.statuses())
            + repr(kind_provider.sources())
            + repr(manager.clusters()["fine"])
        )
        leaked = token in exposed
        assert not leaked, "a token reached a log, an error or a repr"


# --- the README's example ---------------------------------------------------------------------

README = Path(__file__).resolve().parent.parent / "README.md"


async def test_the_readme_example_reconciles_configmaps_of_kind_clusters(
    kind: FakeKind, fleet: Fleet, capsys: pytest.CaptureFixture[str]
) -> None:
    example = README.read_text().split("```python\n", 1)[1].split("```", 1)[0]
    start = "asyncio.run(mgr.start())"
    assert start in example and "mcr.Manager(provider)" in example
    runnable = example.replace(start, "").replace(
        "mcr.Manager(provider)", "mcr.Manager(provider, handle_signals=False)"
    )
    namespace: dict[str, Any] = {}
    exec(compile(runnable, str(README), "exec"), namespace)  # noqa: S102 - our own README
    manager, kind_provider = namespace["mgr"], namespace["provider"]
    assert isinstance(kind_provider, KindProvider) and kind_provider.settings.poll_interval == 2.0
    plane = fleet["cluster-2"]
    kind.create("one", plane.kubeconfig())
    runner = asyncio.create_task(manager.start())
    printed: list[str] = []

    def seen(line: str) -> bool:
        printed.append(capsys.readouterr().out)
        return line in "".join(printed)

    try:
        async with mcr.Cluster("seed", mcr.kubeconfig_from_dict(plane.kubeconfig())) as seed:
            ns = f"readme-{os.getpid()}-{id(printed)}"
            await seed.client.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
            await seed.client.create(
                {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "hello", "namespace": ns}}
            )
        await wait_until(lambda: seen(f"ConfigMap {ns}/hello in cluster 'one'"), what="the example's line")
    finally:
        manager.stop()
        await runner


# --- settings ----------------------------------------------------------------------------------


def test_every_option_comes_from_mcruntime_kind_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MCRUNTIME_KIND_BINARY", "/opt/kind/bin/kind")
    monkeypatch.setenv("MCRUNTIME_KIND_POLL_INTERVAL", "0.5")
    monkeypatch.setenv("MCRUNTIME_KIND_PREFIX", "dev-")
    monkeypatch.setenv("MCRUNTIME_KIND_CLUSTERS", "dev-a, dev-b")
    monkeypatch.setenv("MCRUNTIME_KIND_INTERNAL", "true")
    monkeypatch.setenv("MCRUNTIME_KIND_COMMAND_TIMEOUT", "5")
    settings = KindProvider.from_settings().settings
    assert settings == KindSettings(
        binary="/opt/kind/bin/kind",
        poll_interval=0.5,
        prefix="dev-",
        clusters=("dev-a", "dev-b"),
        internal=True,
        command_timeout=5,
    )
    assert KindProvider(clusters="dev-a, dev-b").settings.clusters == ("dev-a", "dev-b")
    monkeypatch.setenv("MCRUNTIME_KIND_POLL_INTERVAL", "0")
    monkeypatch.setenv("MCRUNTIME_KIND_CLUSTERS", "Dev_A")
    with pytest.raises(mcr.SettingsError) as invalid:
        KindSettings.load()
    message = str(invalid.value)
    assert "poll_interval (MCRUNTIME_KIND_POLL_INTERVAL): Input should be greater than 0" in message
    assert "MCRUNTIME_KIND_CLUSTERS" in message and "is not a kind cluster name" in message


def test_defaults_match_kind_and_the_go_provider(monkeypatch: pytest.MonkeyPatch) -> None:
    for variable in [name for name in os.environ if name.startswith("MCRUNTIME_KIND_")]:
        monkeypatch.delenv(variable)
    settings = KindProvider().settings
    assert (settings.binary, settings.poll_interval, settings.prefix, settings.clusters) == (
        "kind",
        2.0,
        "",
        None,
    )
    assert (settings.internal, settings.command_timeout) == (False, 30.0)
    with pytest.raises(mcr.SettingsError, match="MCRUNTIME_KIND_POLL_INTERVAL"):
        KindProvider(poll_interval=-1)


# --- conformance -------------------------------------------------------------------------------
