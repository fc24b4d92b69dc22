"""The demo behind ``hatch run demo``: job-fanout on a local fleet that changes while it runs.

What it does, in order, saying so as it goes:

1. finds kube-apiserver, etcd, kube-controller-manager, kube-scheduler and kwok
   (or builds them from Go modules, the first time only, with progress);
2. starts three local clusters: ``main`` (the hub, where Tests live) and
   ``east`` and ``west``, whose kubeconfigs it writes into a directory that
   provider-file watches; each runs the real Job, garbage-collection and
   namespace controllers, a scheduler and a kwok node;
3. runs job-fanout (examples/job-fanout) with its metrics endpoint and creates
   two Tests, one whose Job's Pod fails in ``east``;
4. starts a fourth control plane, ``north``, and writes its kubeconfig: it joins
   and gets the Tests' Jobs; then deletes ``west``'s kubeconfig: it leaves;
5. creates a third Test on the changed fleet and deletes the first one (its
   finalizer removes its Jobs everywhere);
6. prints a summary (clusters, reconciles, Tests, values scraped from the
   metrics endpoint, elapsed time) and shuts everything down, also on Ctrl-C.

On a terminal the progress is a live view (rich); otherwise, as in CI, it is
plain lines. ``--keep`` keeps everything running afterwards and prints the
``KUBECONFIG`` lines to explore the clusters with kubectl.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import logging
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

import aiohttp
import yaml
from prometheus_client.parser import text_string_to_metric_families
from rich.console import Console, Group
from rich.live import Live
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

import mcruntime as mcr
from job_fanout import JOB, MAIN, TEST, build, install_crd, make_test
from mcruntime.testing import ControlPlane, Fleet, TestbedError, find_assets, find_workload_assets
from mcruntime_file import KubeconfigFileProvider

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric

NAMESPACE = "demo"
PHASE_TIMEOUT = 45.0
"""Seconds each step may take before the demo says what it was waiting for and stops."""
STYLE = {"finished": "green", "succeeded": "green", "error": "red", "failed": "red", "running": "yellow"}


class DemoError(Exception):
    """A step did not complete; the message says which and what was seen instead."""


# --- what the demo has seen ---------------------------------------------------------------------


@dataclass
class Seen:
    """Everything the view and the summary show, updated as the demo runs."""

    started: float = field(default_factory=time.monotonic)
    clusters: dict[str, str] = field(default_factory=dict)  # name -> state, in order of appearance
    tests: dict[str, dict[str, Any]] = field(default_factory=dict)  # name -> status
    deleted_tests: list[str] = field(default_factory=list)
    events: collections.deque[str] = field(default_factory=lambda: collections.deque(maxlen=12))
    reconciles: dict[tuple[str, str], int] = field(default_factory=dict)  # (controller, cluster) -> count
    step: str = ""

    def elapsed(self) -> float:
        """Seconds since the demo started."""
        return time.monotonic() - self.started


def reconcile_counts(families: Iterable[Metric]) -> dict[tuple[str, str], int]:
    """``controller_runtime_reconcile_total`` summed over results, by (controller, cluster)."""
    counts: dict[tuple[str, str], int] = collections.defaultdict(int)
    for family in families:
        for sample in family.samples:
            if sample.name == "controller_runtime_reconcile_total":
                cluster = sample.labels["cluster"]
                key = (sample.labels["controller"], MAIN if cluster in ("", "local") else cluster)
                counts[key] += int(sample.value)
    return dict(counts)


# --- output: a live view on a terminal, plain lines elsewhere ----------------------------------------


class Output:
    """Narrates the demo: prints lines (plain) or keeps a live rich view current (terminal)."""

    def __init__(self, seen: Seen, stream: TextIO, live: bool) -> None:
        self.seen = seen
        self.stream = stream
        self.console = Console(file=stream, highlight=False)
        self.live: Live | None = None
        self._want_live = live

    def say(self, message: str) -> None:
        """A line of narration: printed now (plain) or added to the view's event list (live)."""
        stamp = f"[{self.seen.elapsed():5.1f}s]"
        self.seen.events.append(f"{stamp} {message}")
        if self.live is None:
            print(f"{stamp} {message}", file=self.stream, flush=True)

    def step(self, title: str) -> None:
        """Start a step: named in the view's header and narrated as a ``==`` line."""
        self.seen.step = title
        self.say(f"== {title}")

    def start_live(self) -> None:
        """Switch to the live view (on a terminal only); from now on narration goes into it."""
        if self._want_live:
            self.live = Live(get_renderable=self.render, console=self.console, refresh_per_second=4)
            self.live.start()

    def stop_live(self) -> None:
        """Leave the live view; its last frame stays on the screen and narration prints again."""
        if self.live is not None:
            self.live.stop()
            self.live = None

    def render(self) -> Group:
        """The live view: clusters with their state and reconcile counts, the Tests, recent events."""
        seen = self.seen
        clusters = Table(title="clusters")
        clusters.add_column("cluster")
        clusters.add_column("state")
        clusters.add_column("Jobs of the Tests")
        controllers = sorted({controller for controller, _ in seen.reconciles})
        for controller in controllers:
            clusters.add_column(f"{controller} reconciles", justify="right")
        for name, state in seen.clusters.items():
            color = {"ready": "green", "left": "dim", "engaging": "yellow"}.get(state, "red")
            counts = [str(seen.reconciles.get((controller, name), 0)) for controller in controllers]
            job_phases = collections.Counter(
                str(phase)
                for status in seen.tests.values()
                if (phase := (status.get("clusters") or {}).get(name)) is not None
            )
            cell = Text()
            for phase, count in sorted(job_phases.items()):
                cell.append(f"{count} {phase}  ", style=STYLE.get(phase, ""))
            clusters.add_row(name, Text(state, style=color), cell, *counts)
        tests = Table(title=f"Tests in namespace {NAMESPACE!r} on the main cluster")
        tests.add_column("Test")
        tests.add_column("phase")
        tests.add_column("Job per cluster")
        for name, status in seen.tests.items():
            phase = status.get("phase") or "pending"
            jobs = Text()
            for cluster, job in (status.get("clusters") or {}).items():
                jobs.append(f"{cluster}: ", style="bold")
                jobs.append(f"{job}  ", style=STYLE.get(job, ""))
            tests.add_row(name, Text(phase, style=STYLE.get(phase, "")), jobs)
        for name in seen.deleted_tests:
            tests.add_row(
                name, Text("deleted", style="dim"), Text("Jobs removed from every cluster", style="dim")
            )
        events = Text("\n".join(seen.events))
        header = Text(f"mcruntime demo · {seen.elapsed():.0f}s · {seen.step}", style="bold")
        return Group(header, clusters, tests, Panel(events, title="what happened"))


class NarratingHandler(logging.Handler):
    """Turns the controller's own log lines (job_fanout) into narration."""

    def __init__(self, output: Output) -> None:
        super().__init__(logging.INFO)
        self.output = output

    def emit(self, record: logging.LogRecord) -> None:
        """Narrate the record's message."""
        self.output.say(record.getMessage())


# --- the fleet --------------------------------------------------------------------------------------


def write_kubeconfig(target: Path, plane: ControlPlane) -> Path:
    """Write the plane's admin kubeconfig atomically (0600), so a watcher never reads half a file."""
    temporary = target.with_name(f".{target.name}.partial")
    temporary.write_text(yaml.safe_dump(plane.kubeconfig(), sort_keys=False))
    temporary.chmod(0o600)
    temporary.replace(target)
    return target


def start_plane(fleet: Fleet, name: str, say: Callable[[str], None]) -> ControlPlane:
    """Start one control plane (blocking: call it in a thread once the event loop runs)."""
    started = time.monotonic()
    plane = fleet.add(name)
    nodes = ", ".join(plane.workloads.node_names()) if plane.workloads is not None else "no nodes"
    say(
        f"cluster {name!r} serving at {plane.server} with controllers, scheduler and {nodes} "
        f"({time.monotonic() - started:.1f}s)"
    )
    return plane


# --- the scenario -----------------------------------------------------------------------------------


class Demo:
    """The scenario, step by step, against a running job-fanout manager."""

    def __init__(self, fleet: Fleet, workdir: Path, output: Output, seen: Seen) -> None:
        self.fleet = fleet
        self.workdir = workdir
        self.fleet_dir = workdir / "fleet"
        self.output = output
        self.seen = seen
        self.manager: mcr.Manager | None = None
        self.provider: KubeconfigFileProvider | None = None
        self.metrics_url = ""
        self.main: mcr.Cluster | None = None
        self.runner: asyncio.Task[None] | None = None

    def say(self, message: str) -> None:
        """Narrate one line."""
        self.output.say(message)

    async def wait(self, what: str, condition: Callable[[], Awaitable[bool]]) -> None:
        """Wait for ``condition`` (checked as the view refreshes) with a deadline."""
        deadline = time.monotonic() + PHASE_TIMEOUT
        while not await condition():
            if time.monotonic() > deadline:
                raise DemoError(f"not within {PHASE_TIMEOUT:.0f}s: {what}; Tests: {self.seen.tests}")
            await asyncio.sleep(0.2)

    async def refresh(self) -> None:
        """Bring what the view shows up to date with the clusters and the manager."""
        assert self.manager is not None and self.provider is not None and self.main is not None
        statuses = self.provider.statuses()
        self.seen.clusters[MAIN] = "ready" if self.main.health.healthy else "unhealthy"
        for name, status in statuses.items():
            self.seen.clusters[name] = status.phase.value
        for name in list(self.seen.clusters):
            if name != MAIN and name not in statuses:
                self.seen.clusters[name] = "left"
        tests = await self.main.client.list(TEST, namespace=NAMESPACE)
        self.seen.tests = {t["metadata"]["name"]: t.get("status") or {} for t in tests.items}
        self.seen.reconciles = reconcile_counts(self.manager.metrics.registry.collect())

    async def watch(self) -> None:
        """Keep the view current until cancelled (a failed read only skips one refresh)."""
        while True:
            with contextlib.suppress(mcr.MCRuntimeError):
                await self.refresh()
            await asyncio.sleep(0.25)

    async def settled(self, expected: dict[str, str], clusters: set[str]) -> bool:
        """Every named Test has the expected phase with a Job in exactly ``clusters``."""
        await self.refresh()
        return all(
            (self.seen.tests.get(name) or {}).get("phase") == phase
            and set((self.seen.tests.get(name) or {}).get("clusters") or {}) == clusters
            for name, phase in expected.items()
        )

    async def run(self, plane_names: list[str], new_plane: str, leaving: str) -> None:
        """Write kubeconfigs, install the CRD, start job-fanout, then run the scenario."""
        main_plane = self.fleet[MAIN]
        main_file = write_kubeconfig(self.workdir / "main.kubeconfig", main_plane)
        self.fleet_dir.mkdir(parents=True, exist_ok=True)
        for name in plane_names:
            write_kubeconfig(self.fleet_dir / f"{name}.kubeconfig", self.fleet[name])
        self.say(
            f"kubeconfigs of {', '.join(plane_names)} written to {self.fleet_dir} (watched by provider-file)"
        )

        main_config = mcr.load_kubeconfig(main_file)
        async with mcr.Cluster(mcr.LOCAL_CLUSTER, main_config) as bootstrap:
            await install_crd(bootstrap)
            with contextlib.suppress(mcr.AlreadyExists):
                await bootstrap.client.create(
                    {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}
                )
        self.say("Test CRD (tests.demo.mcruntime.dev) installed on main")

        self.provider = KubeconfigFileProvider(self.fleet_dir, naming="context", removal_delay=0.2)
        manager, _ = build(main_config, self.provider, metrics_address="127.0.0.1:0", handle_signals=False)
        self.manager = manager
        self.runner = asyncio.create_task(manager.start(), name="manager")
        watcher: asyncio.Task[None] | None = None
        try:
            started = asyncio.create_task(manager.wait_started())
            await asyncio.wait({self.runner, started}, return_when=asyncio.FIRST_COMPLETED)
            if not started.done():  # start() returned or raised before it was up: say why
                started.cancel()
                self.runner.result()
                raise DemoError("job-fanout's manager stopped while starting")
            self.main = await manager.get_cluster(mcr.LOCAL_CLUSTER)
            self.metrics_url = manager.endpoints.url("/metrics")
            self.say(f"job-fanout running; metrics at {self.metrics_url}")
            self.say(
                "Jobs run for real: kube-controller-manager's Job controller makes their Pods, "
                "kube-scheduler binds them to kwok nodes, kwok runs them; deletion is garbage-collected"
            )
            self.output.start_live()
            watcher = asyncio.create_task(self.watch(), name="view")
            await self.scenario(plane_names, new_plane, leaving)
        finally:
            if watcher is not None:
                watcher.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await watcher
            if self.main is not None and self.seen.step != "stopping":
                with contextlib.suppress(mcr.MCRuntimeError):
                    await self.refresh()

    async def scenario(self, plane_names: list[str], new_plane: str, leaving: str) -> None:
        """The four steps; each ends when the clusters show its expected outcome."""
        assert self.main is not None
        first = {MAIN, *plane_names}
        self.output.step(
            f"1/4 two Tests on a fleet of {len(first)}: smoke, and flaky whose Job fails in east"
        )
        await self.main.client.create(make_test("smoke", NAMESPACE))
        await self.main.client.create(make_test("flaky", NAMESPACE, fail_in=["east"]))
        await self.wait(
            "smoke finished and flaky error on main, east and west",
            lambda: self.settled({"smoke": "finished", "flaky": "error"}, first),
        )
        self.say("smoke is finished, flaky is error (its Job failed in east)")

        self.output.step(f"2/4 a fourth cluster, {new_plane!r}, joins")
        plane = await asyncio.to_thread(start_plane, self.fleet, new_plane, self.say)
        write_kubeconfig(self.fleet_dir / f"{new_plane}.kubeconfig", plane)
        self.say(f"wrote {new_plane}.kubeconfig into the watched directory")
        grown = first | {new_plane}
        await self.wait(
            f"the Tests' Jobs run in {new_plane} too",
            lambda: self.settled({"smoke": "finished", "flaky": "error"}, grown),
        )
        self.say(f"{new_plane} joined: both Tests ran their Job there too")

        self.output.step(f"3/4 {leaving!r} leaves")
        (self.fleet_dir / f"{leaving}.kubeconfig").unlink()
        self.say(f"deleted {leaving}.kubeconfig from the watched directory")
        shrunk = grown - {leaving}
        await self.wait(
            f"{leaving} dropped out of the Tests' status",
            lambda: self.settled({"smoke": "finished", "flaky": "error"}, shrunk),
        )
        self.say(f"{leaving} left: it is no longer part of the Tests' status")

        self.output.step("4/4 a new Test on the changed fleet, and the first one deleted")
        await self.main.client.create(make_test("late", NAMESPACE))
        await self.main.client.delete(TEST, "smoke", namespace=NAMESPACE)
        assert self.manager is not None

        async def done() -> bool:
            if (
                not await self.settled({"late": "finished", "flaky": "error"}, shrunk)
                or "smoke" in self.seen.tests
            ):
                return False
            assert self.manager is not None
            left = [
                name
                for name, cluster in self.manager.clusters().items()
                if await cluster.cache.get_or_none(JOB, "smoke", namespace=NAMESPACE) is not None
            ]
            return not left

        await self.wait("late finished, smoke and its Jobs deleted", done)
        self.seen.deleted_tests.append("smoke")
        self.say(
            f"late finished on {', '.join(sorted(shrunk))}; smoke deleted with its Jobs in every cluster"
        )
        self.output.step("done")

    async def scrape(self) -> dict[str, float]:
        """Values read back from the metrics endpoint, as a Prometheus server would."""
        async with aiohttp.ClientSession() as session, session.get(self.metrics_url) as response:
            response.raise_for_status()
            text = await response.text()
        families = list(text_string_to_metric_families(text))
        values: dict[str, float] = collections.defaultdict(float)
        for family in families:
            for sample in family.samples:
                if sample.name in (
                    "controller_runtime_reconcile_total",
                    "controller_runtime_reconcile_errors_total",
                    "mcruntime_cluster_engagements_total",
                    "mcruntime_cluster_disengagements_total",
                    "workqueue_adds_total",
                ):
                    values[sample.name] += sample.value
        for (controller, _cluster), count in reconcile_counts(families).items():
            values[f"reconciles of {controller}"] += count
        return dict(values)

    async def stop(self) -> None:
        """Stop the manager gracefully and wait until it has (its clusters' connections closed)."""
        if self.manager is None or self.runner is None:
            return
        self.manager.stop()
        try:
            await asyncio.wait_for(asyncio.shield(self.runner), self.manager.graceful_shutdown_timeout + 5)
        except TimeoutError:
            self.runner.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.runner


def summary(seen: Seen, metrics_url: str, scraped: dict[str, float] | None) -> list[str]:
    """The closing lines: what ran, what it did, and how long it took."""
    lines = ["", "Summary"]
    joined = ", ".join(f"{name} ({state})" for name, state in seen.clusters.items())
    lines.append(f"  clusters seen: {len(seen.clusters)}: {joined}")
    by_controller: dict[str, int] = collections.defaultdict(int)
    for (controller, _cluster), count in seen.reconciles.items():
        by_controller[controller] += count
    lines.append(
        "  reconciles: "
        + ", ".join(f"{controller} {count}" for controller, count in sorted(by_controller.items()))
    )
    phases = collections.Counter(status.get("phase") or "pending" for status in seen.tests.values())
    listed = ", ".join(f"{name}: {status.get('phase')}" for name, status in seen.tests.items())
    lines.append(
        f"  Tests: {phases['finished']} finished, {phases['error']} error, {len(seen.deleted_tests)} deleted"
        f" ({listed}; deleted: {', '.join(seen.deleted_tests) or 'none'})"
    )
    if scraped is not None:
        lines.append(f"  metrics scraped from {metrics_url}:")
        for name, value in sorted(scraped.items()):
            lines.append(f"    {name} = {value:g}")
    lines.append(f"  elapsed: {seen.elapsed():.1f}s")
    return lines


# --- the program -----------------------------------------------------------------------------------


def parse_arguments(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The demo's options."""
    parser = argparse.ArgumentParser(
        prog="hatch run demo --", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--keep",
        action="store_true",
        help="keep the fleet and the controller running afterwards (Ctrl-C stops)",
    )
    parser.add_argument("--plain", action="store_true", help="plain lines even on a terminal (no live view)")
    parser.add_argument(
        "--workdir", help="where kubeconfigs and cluster data go (default: a new temporary directory)"
    )
    return parser.parse_args(argv)


def find_binaries(say: Callable[[str], None]) -> None:
    """Say so before a long first-time build, so a silent terminal is never a mystery."""
    if find_assets() is None:
        say(
            "kube-apiserver and etcd not found: building them with Go from the module proxy "
            "(about four minutes on two cores, once; cached in ~/.local/share/kubebuilder-envtest)"
        )
    if find_workload_assets() is None:
        say(
            "kube-controller-manager, kube-scheduler and kwok not found: building them with Go from "
            "the module proxy (about eight more minutes on two cores, once; cached in the same place)"
        )


async def run_demo(
    fleet: Fleet, workdir: Path, arguments: argparse.Namespace, output: Output, seen: Seen
) -> int:
    """Run the scenario (and, with ``--keep``, wait for Ctrl-C); returns the exit code."""
    demo = Demo(fleet, workdir, output, seen)
    main_task = asyncio.current_task()
    assert main_task is not None
    loop = asyncio.get_running_loop()
    interrupted = False

    def interrupt() -> None:
        nonlocal interrupted
        if not interrupted:
            interrupted = True
            main_task.cancel()

    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, interrupt)
    status = 0
    scraped: dict[str, float] | None = None
    try:
        scenario = asyncio.create_task(demo.run(["east", "west"], "north", "west"), name="scenario")
        try:
            await scenario
            scraped = await demo.scrape()
        except (DemoError, mcr.MCRuntimeError) as error:
            output.stop_live()
            output.say(f"demo failed: {error}")
            status = 1
        if arguments.keep and status == 0:
            output.stop_live()
            print_keep(fleet, workdir, demo, output)
            await asyncio.Event().wait()  # until Ctrl-C
    except asyncio.CancelledError:
        output.stop_live()
        output.say("interrupted: shutting down")
        status = 130
    finally:
        output.stop_live()
        seen.step = "stopping"
        await demo.stop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(signum)
    for line in summary(seen, demo.metrics_url, scraped):
        print(line, file=output.stream, flush=True)
    return status


def print_keep(fleet: Fleet, workdir: Path, demo: Demo, output: Output) -> None:
    """The lines a user pastes to explore the running fleet with kubectl."""
    out = output.stream
    print("\nThe fleet keeps running; explore it with kubectl:", file=out)
    print(
        f"  export KUBECONFIG={workdir / 'main.kubeconfig'}   # main: kubectl get tests -n {NAMESPACE}",
        file=out,
    )
    for path in sorted(demo.fleet_dir.glob("*.kubeconfig")):
        print(f"  export KUBECONFIG={path}   # {path.stem}: kubectl get jobs -n {NAMESPACE}", file=out)
    print(f"  metrics: curl {demo.metrics_url}", file=out)
    print("Press Ctrl-C to stop every control plane.", file=out, flush=True)


def main(argv: Sequence[str] | None = None, stream: TextIO | None = None) -> int:
    """Run the demo; returns the exit code (0 done, 1 a step failed, 130 interrupted)."""
    arguments = parse_arguments(argv)
    out = stream or sys.stdout
    seen = Seen()
    output = Output(seen, out, live=out.isatty() and not arguments.plain)
    handler = NarratingHandler(output)
    for name in ("job_fanout",):
        logger = logging.getLogger(name)
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        logger.propagate = False
    workdir = (
        Path(arguments.workdir).resolve()
        if arguments.workdir
        else Path(tempfile.mkdtemp(prefix="mcruntime-demo-"))
    )
    workdir.mkdir(parents=True, exist_ok=True)
    output.step(
        "starting a local fleet (real kube-apiserver, etcd, kube-controller-manager, kube-scheduler "
        "and kwok processes; no Docker)"
    )
    output.say(f"working directory: {workdir}")
    try:
        find_binaries(output.say)
        progress = lambda message: output.say(f"build: {message}")  # noqa: E731 -- the testbed's build steps
        with Fleet(workdir=workdir / "clusters", progress=progress, workloads=True) as fleet:
            assets = fleet.assets
            output.say(f"binaries: {assets.kube_apiserver} ({assets.kube_apiserver_source})")
            extra = fleet.workload_assets
            output.say(f"workload binaries: kube-controller-manager {extra.kube_controller_manager}")
            for name in (MAIN, "east", "west"):
                start_plane(fleet, name, output.say)
            return asyncio.run(run_demo(fleet, workdir, arguments, output, seen))
    except KeyboardInterrupt:  # Ctrl-C before the scenario's own handler was installed
        output.stop_live()
        output.say("interrupted: every control plane started so far is stopped")
        return 130
    except TestbedError as error:
        output.stop_live()
        print(f"demo: the testbed could not start: {error}", file=sys.stderr)
        return 1
    finally:
        for name in ("job_fanout",):
            logging.getLogger(name).removeHandler(handler)
        if not arguments.workdir:
            shutil.rmtree(workdir, ignore_errors=True)
        print("demo: every control plane is stopped.", file=out, flush=True)


if __name__ == "__main__":
    sys.exit(main())
