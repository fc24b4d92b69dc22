"""The line protocol every benchmark peer speaks, for the Python peers.

The harness compares peers written in different languages, so they share a
protocol rather than code: JSON lines on stdout and one-word commands on stdin
(see ``mcr-go/main.go`` for the same in Go). Records are buffered and flushed
every 50 ms so that reporting costs a peer one write per batch, not one system
call per reconcile; the timestamps inside the records, not their arrival time,
are what the harness measures.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import os
import re
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import orjson

FLUSH_INTERVAL = 0.05


@functools.cache
def _libc() -> Any:
    """glibc, loaded when a measurement first asks: ``ctypes`` cost every peer 6 to 10 ms of start."""
    import ctypes

    try:
        return ctypes.CDLL("libc.so.6")
    except OSError:
        return None


@functools.cache
def _mallinfo2() -> Any:
    import ctypes

    class _MallInfo2(ctypes.Structure):
        _fields_ = [  # noqa: RUF012 (ctypes wants a plain list)
            (name, ctypes.c_size_t)
            for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks")
            + ("uordblks", "fordblks", "keepcost")
        ]

    info = getattr(_libc(), "mallinfo2", None)
    if info is not None:
        info.restype = _MallInfo2
    return info


def trim_malloc() -> bool:
    """``malloc_trim(0)``: hand glibc's free heap pages back to the OS, as Go's ``FreeOSMemory`` does."""
    trim = getattr(_libc(), "malloc_trim", None)
    if trim is None:
        return False
    trim(0)
    return True


def _pymalloc_bytes() -> int | None:
    """Bytes in pymalloc's allocated blocks (``sys._debugmallocstats``, which writes to fd 2)."""
    import tempfile

    with tempfile.TemporaryFile() as capture:
        sys.stderr.flush()
        saved = os.dup(2)
        try:
            os.dup2(capture.fileno(), 2)
            sys._debugmallocstats()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        capture.seek(0)
        text = capture.read().decode(errors="replace")
    found = re.search(r"# bytes in allocated blocks\s*=\s*([\d,]+)", text)
    return int(found.group(1).replace(",", "")) if found else None


def heap_bytes() -> int | None:
    """The Python heap in use: pymalloc's allocated blocks plus glibc malloc's in-use bytes.

    malloc's figure is ``mallinfo2``'s ``uordblks + hblkhd`` (in-use arena bytes
    and mmapped blocks); pymalloc's arenas are mmapped by CPython itself and not
    in it. The counterpart of Go's ``HeapInuse``; None where glibc is missing.
    """
    info = _mallinfo2()
    small = _pymalloc_bytes()
    if info is None or small is None:
        return None
    stats = info()
    return small + int(stats.uordblks) + int(stats.hblkhd)


class PeerIO:
    """Buffers records for stdout and answers ``stats``/``gc`` commands from stdin."""

    def __init__(
        self,
        clusters: Callable[[], int],
        extra: Callable[[], dict[str, Any]] | None = None,
        commands: dict[str, Callable[[], None]] | None = None,
    ) -> None:
        """``clusters`` counts the engaged clusters for ``stats`` answers; ``extra`` adds figures to them.

        ``commands``: more stdin commands by name, each answered with ``{"ev": name}`` once done.
        """
        self._clusters = clusters
        self._extra = extra
        self._commands = commands or {}
        self._pending: list[bytes] = []
        self._timer: asyncio.TimerHandle | None = None
        self.closed = asyncio.Event()

    def emit(self, record: dict[str, Any]) -> None:
        """Queue one record; it reaches stdout within ``FLUSH_INTERVAL``.

        The first record after a flush arms the one timer that flushes it: a
        peer with nothing to report never wakes for its reporting. Records are
        encoded by orjson, as the Go peer's are by its compiled encoder: the
        reporting channel is the harness's, not the runtime under test.
        """
        self._pending.append(orjson.dumps(record))
        if self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(FLUSH_INTERVAL, self._flush_due)

    def _flush_due(self) -> None:
        self._timer = None
        self.flush()

    def flush(self) -> None:
        """Write every queued record now."""
        if self._pending:
            self._pending.append(b"")
            sys.stdout.buffer.write(b"\n".join(self._pending))
            self._pending.clear()
        sys.stdout.buffer.flush()

    def _command(self, line: str) -> None:
        if line == "stats":
            extra = self._extra() if self._extra is not None else {}
            counts = {"clusters": self._clusters(), "tasks": len(asyncio.all_tasks()), "gc_s": _GC_CLOCK.seconds}
            self.emit({"ev": "stats", **counts, **extra})
        elif line == "gc":
            gc.collect()
            trim_malloc()
            self.emit({"ev": "gc", "heap": heap_bytes()})
        elif line in self._commands:
            self._commands[line]()
            self.emit({"ev": line})
        self.flush()

    async def run(self) -> None:
        """Serve stdin until it closes (the harness went away), then flush what is left."""
        loop = asyncio.get_running_loop()

        def read() -> None:  # a thread: asyncio has no portable non-blocking stdin
            for raw in sys.stdin:
                loop.call_soon_threadsafe(self._command, raw.strip())
            loop.call_soon_threadsafe(self.closed.set)

        threading.Thread(target=read, name="peer-stdin", daemon=True).start()
        try:
            await self.closed.wait()  # records flush themselves (emit arms the timer)
        finally:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            self.flush()


class _GcClock:
    """Seconds spent in the cyclic garbage collector so far, every generation, explicit ones included."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self._began = 0.0
        gc.callbacks.append(self._tick)

    def _tick(self, phase: str, _info: dict[str, Any]) -> None:
        if phase == "start":
            self._began = time.perf_counter()
        else:
            self.seconds += time.perf_counter() - self._began


_GC_CLOCK = _GcClock()


def start_record() -> dict[str, Any]:
    """The first line of every peer: when its own code began (after imports)."""
    return {"ev": "start", "t": time.time()}


def written_at(data: object) -> float | None:
    """The writer's timestamp in a ConfigMap's ``data.ts``: parsing it is part of the work."""
    if isinstance(data, dict):
        value = data.get("ts")
        if isinstance(value, str):
            try:
                return float(value)
            except ValueError:
                return None
    return None
