"""Plumbing shared by the scenarios: peer processes, kubeconfig files, seeding and the floor.

Every peer (mcruntime, the Go multicluster-runtime program, kopf) runs as a
child process speaking the line protocol of ``peers/peerio.py``; the harness
measures RSS and file descriptors from outside through psutil, so the figures
mean the same for a Python and a Go process. Children are put in their own
process group and armed with ``PR_SET_PDEATHSIG``, and :func:`running` stops
them in a ``finally``, so a failed or interrupted run leaves nothing behind.
"""

from __future__ import annotations

import asyncio
import compileall
import contextlib
import ctypes
import hashlib
import importlib.util
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import psutil
import yaml

import mcruntime as mcr
from mcruntime.testing import ControlPlane

HERE = Path(__file__).resolve().parent
PEERS = HERE / "peers"
GO_SOURCE = PEERS / "mcr-go"
CACHE_DIR = Path(os.environ.get("MCRUNTIME_BENCH_CACHE", "~/.cache/mcruntime-bench")).expanduser()
CONFIGMAP = mcr.Kind("v1", "ConfigMap")
MIB = 1024 * 1024
PAYLOAD = "x" * 200  # about the size of a small real ConfigMap


class BenchError(RuntimeError):
    """A scenario could not complete; the message says which peer and why."""


# --- the Go peer ------------------------------------------------------------------------


def go_version() -> str | None:
    """``go version`` output, or None without a Go toolchain."""
    go = shutil.which("go")
    if go is None:
        return None
    return subprocess.run([go, "version"], capture_output=True, text=True, check=True).stdout.strip()


def compile_python_peers(log: Callable[[str], None]) -> None:
    """Byte-compile the Python peers' own sources, as ``pip install`` does for an installed package.

    The Go peer runs as a compiled binary, and every dependency in the
    environment was byte-compiled when it was installed; an editable checkout
    of mcruntime is not, and with ``PYTHONDONTWRITEBYTECODE`` set (as on CI)
    every peer process would compile it from source again: about 0.09 s of
    CPU per start that no deployed operator pays. ``compileall`` writes the
    ``__pycache__`` directories next to the sources (ignored by git) and skips
    what is up to date.
    """
    roots = [PEERS]
    for name in ("mcruntime", "mcruntime_file", "kopf"):
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.origin is not None:
            roots.append(Path(spec.origin).parent)
    started = time.monotonic()
    if not all(compileall.compile_dir(str(root), quiet=1) for root in roots):
        raise SystemExit(f"benchmarks: byte-compiling {', '.join(map(str, roots))} failed (see above)")
    log(f"Python peers: byte-compiled in {time.monotonic() - started:.1f}s")


def build_go_peer(log: Callable[[str], None]) -> Path:
    """Build ``peers/mcr-go`` with ``go build`` into the cache directory, once per source digest.

    The binary lives outside the repository (never committed) and is named by a
    digest of the sources, so an edited peer is rebuilt and an unchanged one is
    not; Go's own build cache makes a rebuild after a small edit quick.
    """
    go = shutil.which("go")
    if go is None:
        raise SystemExit(
            "benchmarks: the Go peer needs a Go toolchain (1.25 or newer) on PATH, and none was found.\n"
            "Install Go (https://go.dev/doc/install), or leave the Go peer out with --peers mcruntime,kopf."
        )
    digest = hashlib.sha256()
    for path in sorted([GO_SOURCE / "go.mod", GO_SOURCE / "go.sum", *GO_SOURCE.glob("*.go")]):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    binary = CACHE_DIR / f"mcr-go-{digest.hexdigest()[:12]}"
    if binary.exists():
        log(f"Go peer: cached {binary}")
        return binary
    CACHE_DIR.mkdir(parents=True, exist_ok=True)
    partial = binary.with_suffix(".partial")
    # providers/file is on the module proxy but not in the checksum database:
    # go.sum pins its hash, so skipping the database lookup for it loses nothing.
    env = os.environ | {
        "GOFLAGS": "-mod=readonly",
        "GONOSUMDB": "sigs.k8s.io/multicluster-runtime/providers/file",
    }
    started = time.monotonic()
    log("Go peer: go build (a cold build takes a few minutes on 2 cores) ...")
    result = subprocess.run(
        [go, "build", "-trimpath", "-o", str(partial), "."],
        cwd=GO_SOURCE,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        raise SystemExit(f"benchmarks: go build of {GO_SOURCE} failed:\n{result.stderr}")
    os.replace(partial, binary)
    log(f"Go peer: built in {time.monotonic() - started:.0f}s -> {binary}")
    return binary


def raise_fd_limit(wanted: int) -> tuple[int, int]:
    """Raise this process's open-file limit to ``wanted`` (children inherit it); return (before, after).

    The soft limit rises to the hard one; the hard one rises too only where
    the harness may (root, up to ``fs.nr_open``). Peers and control planes
    started afterwards inherit it: a fleet of N clusters over HTTP/1.1 holds
    about 2.6 N sockets in the peer (one per watch, plus pooled ones).
    Never lowers a limit.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    before = soft
    target = max(soft, wanted)
    if hard != resource.RLIM_INFINITY and target > hard:
        with contextlib.suppress(OSError, ValueError):
            ceiling = int(Path("/proc/sys/fs/nr_open").read_text())
            resource.setrlimit(resource.RLIMIT_NOFILE, (min(target, ceiling), min(target, ceiling)))
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = min(target, hard) if hard != resource.RLIM_INFINITY else target
    if target > soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return before, resource.getrlimit(resource.RLIMIT_NOFILE)[0]


# --- peer processes ---------------------------------------------------------------------


def context_of(cluster: str) -> str:
    """The kubeconfig context in a peer's cluster name (Go names clusters ``<file>+<context>``)."""
    return cluster.rsplit("+", 1)[-1].rsplit("/", 1)[-1]


def _die_with_parent() -> None:
    """In the child, before exec: SIGKILL when the harness dies, whatever the cause."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG


@dataclass
class Peer:
    """One running peer and everything it has reported so far."""

    name: str
    argv: Sequence[str]
    log_path: Path
    spawned: float = 0.0
    started: float | None = None
    exited: bool = False
    seen: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))
    first: dict[str, float] = field(default_factory=dict)
    last: dict[str, float] = field(default_factory=dict)
    records: list[tuple[str, str, float, float | None]] = field(default_factory=list)
    process: asyncio.subprocess.Process | None = None
    _changed: asyncio.Event = field(default_factory=asyncio.Event)
    _replies: asyncio.Queue[dict[str, Any]] = field(default_factory=asyncio.Queue)
    _reader: asyncio.Task[None] | None = None

    @property
    def pid(self) -> int:
        """The peer's process id (only once started)."""
        assert self.process is not None
        return self.process.pid

    async def start(self) -> None:
        """Spawn the peer; ``spawned`` is the wall-clock time just before."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            self.spawned = time.time()
            self.process = await asyncio.create_subprocess_exec(
                *self.argv,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=log,
                start_new_session=True,
                preexec_fn=_die_with_parent,
                limit=1 << 20,
            )
        self._reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        assert self.process is not None and self.process.stdout is not None
        try:
            async for raw in self.process.stdout:
                message = json.loads(raw)
                event = message["ev"]
                if event == "r":
                    cluster, name, at = context_of(message["c"]), message["n"], message["t"]
                    self.records.append((cluster, name, at, message.get("w")))
                    self.seen[cluster].add(name)
                    self.first.setdefault(cluster, at)
                    self.last[cluster] = at
                elif event == "start":
                    self.started = message["t"]
                else:
                    self._replies.put_nowait(message)
                self._changed.set()
        finally:
            self.exited = True
            self._changed.set()

    def reset(self) -> None:
        """Forget the records so far (the process keeps running)."""
        self.seen.clear()
        self.first.clear()
        self.last.clear()
        self.records.clear()

    async def wait_until(self, condition: Callable[[], bool], timeout: float, what: str) -> None:
        """Wait for ``condition`` over the records; fail with the peer's log tail if it dies."""
        deadline = time.monotonic() + timeout
        while not condition():
            if self.exited:
                raise BenchError(f"{self.name} exited while waiting for {what}:\n{self.log_tail()}")
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise BenchError(
                    f"{self.name}: timed out after {timeout:.0f}s waiting for {what}\n{self.log_tail()}"
                )
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), min(remaining, 0.05))

    async def command(self, word: str) -> dict[str, Any]:
        """Send a stdin command and return its answer."""
        assert self.process is not None and self.process.stdin is not None
        while not self._replies.empty():
            self._replies.get_nowait()
        self.process.stdin.write(f"{word}\n".encode())
        await self.process.stdin.drain()
        try:
            return await asyncio.wait_for(self._replies.get(), 30)
        except TimeoutError:
            raise BenchError(f"{self.name} did not answer {word!r}\n{self.log_tail()}") from None

    async def engaged(self) -> int:
        """How many clusters the peer has engaged now."""
        return int((await self.command("stats"))["clusters"])

    def cpu_seconds(self) -> float:
        """The peer's CPU time so far, user + system (``utime + stime`` in /proc)."""
        times = psutil.Process(self.pid).cpu_times()
        return float(times.user + times.system)

    def cpu_split(self) -> dict[str, float]:
        """The peer's CPU time so far: user, system, and its main thread's (the event loop's)."""
        process = psutil.Process(self.pid)
        times = process.cpu_times()
        main = sum(t.user_time + t.system_time for t in process.threads() if t.id == self.pid)
        return {"user": float(times.user), "system": float(times.system), "main_thread": float(main)}

    async def sample(self) -> dict[str, float]:
        """Memory after the same GC for every peer, fds and threads from /proc, tasks, CPU so far.

        Go collects and calls ``FreeOSMemory``; Python collects and calls
        ``malloc_trim(0)``. ``rss`` and ``rss_anon`` (anonymous resident memory,
        heap and stacks without mapped binaries and libraries) come from
        /proc for both; ``heap`` is the runtime's own figure (Go ``HeapInuse``;
        Python pymalloc's allocated blocks + glibc malloc's in-use bytes).
        """
        collected = await self.command("gc")
        await asyncio.sleep(0.2)
        stats = await self.command("stats")
        process = psutil.Process(self.pid)
        heap = collected.get("heap")
        return {
            "rss": process.memory_info().rss / MIB,
            "rss_anon": rss_anon(self.pid) / MIB,
            "heap": float(heap) / MIB if heap is not None else float("nan"),
            "fds": float(process.num_fds()),
            "threads": float(process.num_threads()),
            "tasks": float(stats["tasks"]),
            "clusters": float(stats["clusters"]),
            "cpu_s": self.cpu_seconds(),
        }

    def log_tail(self, lines: int = 20) -> str:
        """The end of the peer's stderr, for error messages."""
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    async def stop(self) -> None:
        """Close stdin (peers exit on EOF), then SIGTERM and SIGKILL the group if need be."""
        process = self.process
        if process is None:
            return
        if process.returncode is None:
            if process.stdin is not None:
                with contextlib.suppress(OSError, RuntimeError):
                    process.stdin.close()
            for signum, grace in ((None, 10.0), (signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
                if signum is not None:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(process.pid, signum)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(process.wait(), grace)
                    break
        if self._reader is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._reader, 5)


def rss_anon(pid: int) -> float:
    """``RssAnon`` of ``pid`` in bytes, from /proc/<pid>/status (0 where the kernel has none)."""
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("RssAnon:"):
                return float(line.split()[1]) * 1024
    return 0.0


@contextlib.asynccontextmanager
async def running(peer: Peer) -> AsyncIterator[Peer]:
    """Start ``peer`` and always stop it."""
    try:
        await peer.start()
        yield peer
    finally:
        await peer.stop()


@dataclass(frozen=True)
class PeerKind:
    """How to start one kind of peer against a kubeconfig directory (or single file, for kopf)."""

    name: str
    multicluster: bool
    command: Callable[[Path, str], list[str]]


def peer_kinds(go_binary: Path | None, local_kubeconfig: Path) -> dict[str, PeerKind]:
    """The peers by name; ``go`` only when its binary was built."""
    python = sys.executable
    kinds = {
        "mcruntime": PeerKind(
            "mcruntime",
            True,
            lambda d, ns: [
                python,
                str(PEERS / "mcruntime_peer.py"),
                "--kubeconfig-dir",
                str(d),
                "--namespace",
                ns,
            ],
        ),
        "kopf": PeerKind(
            "kopf",
            False,
            lambda d, ns: [
                python,
                str(PEERS / "kopf_peer.py"),
                "--kubeconfig",
                str(next(d.glob("*.kubeconfig"))),
                "--namespace",
                ns,
            ],
        ),
    }
    if go_binary is not None:
        binary = str(go_binary)
        for name, engage in (("go", "shipped"), ("go concurrent", "concurrent")):
            kinds[name] = PeerKind(name, True, _go_command(binary, local_kubeconfig, engage))
        # The same runtime on JSON: what controller-runtime speaks to a custom resource.
        kinds[GO_JSON] = PeerKind(GO_JSON, True, _go_command(binary, local_kubeconfig, "concurrent", "json"))
    return kinds


GO_JSON = "go concurrent json"  # controller-runtime's wire for custom resources (built-ins get protobuf)


def _go_command(
    binary: str, local_kubeconfig: Path, engage: str, wire: str = "default"
) -> Callable[[Path, str], list[str]]:
    """The Go peer's command line; ``engage``: shipped or concurrent; ``wire``: default or json."""

    def command(directory: Path, namespace: str) -> list[str]:
        return [
            binary,
            "-kubeconfig-dir",
            str(directory),
            "-local-kubeconfig",
            str(local_kubeconfig),
            "-namespace",
            namespace,
            "-engage",
            engage,
            "-wire",
            wire,
        ]

    return command


# --- kubeconfig files -------------------------------------------------------------------


def kubeconfig(contexts: Iterable[tuple[str, ControlPlane]]) -> dict[str, Any]:
    """One kubeconfig document with a context per ``(name, plane)``; planes may repeat."""
    clusters: dict[str, dict[str, Any]] = {}
    users: dict[str, dict[str, Any]] = {}
    entries: list[dict[str, Any]] = []
    for name, plane in contexts:
        if plane.name not in clusters:
            document = plane.kubeconfig()
            clusters[plane.name] = {"name": plane.name, "cluster": document["clusters"][0]["cluster"]}
            users[plane.name] = {"name": f"{plane.name}-admin", "user": document["users"][0]["user"]}
        entries.append({"name": name, "context": {"cluster": plane.name, "user": f"{plane.name}-admin"}})
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": list(clusters.values()),
        "users": list(users.values()),
        "contexts": entries,
        "current-context": entries[0]["name"] if entries else "",
    }


def write_kubeconfig(
    path: Path, contexts: Iterable[tuple[str, ControlPlane]], document: dict[str, Any] | None = None
) -> float:
    """Write atomically, renamed into place; return the time of the rename.

    The temporary file lives in a sibling staging directory, never in the
    watched one, so a peer sees one event (the rename), not the write too.
    """
    staging = path.parent.with_name(path.parent.name + ".staging")
    staging.mkdir(exist_ok=True)
    temporary = staging / path.name
    content = document if document is not None else kubeconfig(contexts)
    temporary.write_text(yaml.safe_dump(content, sort_keys=False))
    temporary.chmod(0o600)
    at = time.time()
    os.replace(temporary, path)
    return at


# --- seeding, writing and the floor ---------------------------------------------------------


def object_name(index: int) -> str:
    """The benchmark's ConfigMap names."""
    return f"cm-{index:05d}"


async def seed(planes: Sequence[ControlPlane], namespace: str, count: int) -> None:
    """Create ``namespace`` with ``count`` ConfigMaps in every plane (idempotent)."""
    semaphore = asyncio.Semaphore(48)

    async def one(client: mcr.Client, index: int) -> None:
        async with semaphore:
            with contextlib.suppress(mcr.AlreadyExists):
                await client.create(
                    {
                        "apiVersion": "v1",
                        "kind": "ConfigMap",
                        "metadata": {"name": object_name(index), "namespace": namespace},
                        "data": {"ts": repr(time.time()), "payload": PAYLOAD},
                    }
                )

    async def plane_seed(plane: ControlPlane) -> None:
        async with mcr.Cluster(f"seed-{plane.name}", mcr.kubeconfig_from_dict(plane.kubeconfig())) as cluster:
            with contextlib.suppress(mcr.AlreadyExists):
                await cluster.client.create(
                    {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}
                )
            await asyncio.gather(*(one(cluster.client, index) for index in range(count)))

    await asyncio.gather(*(plane_seed(plane) for plane in planes))


async def floor(planes: Sequence[ControlPlane], namespace: str, expected: int, runs: int = 3) -> float:
    """The S1 floor: every plane's paged list (500 a page) fetched and ``orjson.loads``-ed, no runtime.

    The planes are listed concurrently, as the peers' informers list them, over
    one session whose connections a warm-up pass has opened; the fastest of
    ``runs`` timed passes is returned (the floor is what is possible).
    """
    contexts = {plane.name: plane.admin_ssl_context() for plane in planes}  # one each: pooled connections

    async def one(session: aiohttp.ClientSession, plane: ControlPlane) -> int:
        params = {"limit": "500"}
        count = 0
        while True:
            async with session.get(
                f"{plane.server}/api/v1/namespaces/{namespace}/configmaps",
                params=params,
                ssl=contexts[plane.name],
            ) as response:
                page = orjson.loads(await response.read())
            count += len(page["items"])
            token = page["metadata"].get("continue")
            if not token:
                return count
            params["continue"] = token

    best = float("inf")
    async with aiohttp.ClientSession() as session:
        await asyncio.gather(*(one(session, plane) for plane in planes))  # warm-up: connections, TLS
        for _ in range(runs):
            started = time.perf_counter()
            counts = await asyncio.gather(*(one(session, plane) for plane in planes))
            best = min(best, time.perf_counter() - started)
            if sum(counts) != expected:
                raise BenchError(f"floor listed {sum(counts)} ConfigMaps, expected {expected}")
    return best


async def write_load(
    targets: Sequence[tuple[str, ControlPlane]],
    namespace: str,
    objects: int,
    rate: float,
    seconds: float,
) -> list[tuple[str, str, float]]:
    """Patch ``data.ts`` with ``time.time()`` at ``rate`` writes/s for ``seconds``, round-robin.

    Writes rotate over clusters, then objects, so one object is rewritten only
    every ``len(targets) * objects`` writes and two writes rarely coalesce into
    one reconcile. Returns ``(context, name, written_at)`` per write.
    """
    writes: list[tuple[str, str, float]] = []
    clusters = [
        (context, mcr.Cluster(f"writer-{context}", mcr.kubeconfig_from_dict(plane.kubeconfig())))
        for context, plane in targets
    ]
    semaphore = asyncio.Semaphore(64)
    pending: set[asyncio.Task[None]] = set()

    async def patch(cluster: mcr.Cluster, name: str, stamp: float) -> None:
        async with semaphore:
            await cluster.client.patch(CONFIGMAP, name, {"data": {"ts": repr(stamp)}}, namespace=namespace)

    try:
        for _, cluster in clusters:
            await cluster.start()
            await cluster.client.resource(CONFIGMAP)
        loop = asyncio.get_running_loop()
        begin = loop.time()
        total = int(rate * seconds)
        for index in range(total):
            delay = begin + index / rate - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            context, cluster = clusters[index % len(clusters)]
            name = object_name((index // len(clusters)) % objects)
            stamp = time.time()
            writes.append((context, name, stamp))
            task = asyncio.create_task(patch(cluster, name, stamp))
            pending.add(task)
            task.add_done_callback(pending.discard)
        if pending:
            await asyncio.gather(*pending)
    finally:
        for _, cluster in clusters:
            await cluster.stop()
    return writes


def percentile(values: Sequence[float], share: float) -> float:
    """The nearest-rank percentile (``share`` in 0..1) of ``values``."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    rank = max(0, min(len(ordered) - 1, round(share * len(ordered) + 0.5) - 1))
    return ordered[rank]
