"""Child processes that cannot outlive the test run.

Three layers make sure of it: every child runs in its own process group (so a
stop reaches anything it forked), the kernel kills it if our process dies without
cleaning up (``PR_SET_PDEATHSIG``), and an ``atexit`` hook stops whatever is still
registered on an orderly interpreter exit.

The kernel sends the death signal when the *thread* that forked the child
ends, so children are forked only by threads that live as long as the
process: the main thread, or, for callers on other threads (``asyncio.to_thread``,
say), one daemon thread that exists only to spawn.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import ctypes.util
import os
import queue
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import TypeVar

_T = TypeVar("_T")

_PR_SET_PDEATHSIG = 1
_live: set[ManagedProcess] = set()
_live_lock = threading.Lock()


class _Spawner:
    """A daemon thread that forks children for callers on short-lived threads."""

    def __init__(self) -> None:
        self._work: queue.SimpleQueue[tuple[Callable[[], object], Future[object]]] = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._serve, name="mcruntime-testbed-spawner", daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            call, result = self._work.get()
            try:
                result.set_result(call())
            except BaseException as error:  # handed to the caller, who re-raises it
                result.set_exception(error)

    def run(self, call: Callable[[], _T]) -> _T:
        result: Future[object] = Future()
        self._work.put((call, result))
        return result.result()  # type: ignore[return-value]


_spawner: _Spawner | None = None
_spawner_lock = threading.Lock()


def _on_lasting_thread(call: Callable[[], _T]) -> _T:
    """Run ``call`` on the main thread's behalf or on the spawner: never on a thread that may end."""
    global _spawner
    if threading.current_thread() is threading.main_thread():
        return call()
    with _spawner_lock:
        if _spawner is None:
            _spawner = _Spawner()
    if threading.current_thread() is _spawner.thread:
        return call()
    return _spawner.run(call)


def _death_signal_hook(parent: int) -> Callable[[], None] | None:
    library = ctypes.util.find_library("c")
    if library is None:
        return None
    libc = ctypes.CDLL(library, use_errno=True)

    def arm() -> None:
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:  # the parent died before the signal was armed
            os._exit(1)

    return arm


class ManagedProcess:
    """One child process with its output in a log file."""

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        log_path: Path,
        env: dict[str, str] | None = None,
    ) -> None:
        self.name = name
        self.argv: list[str] = list(argv)
        self.log_path = log_path
        self._env = env
        self._popen: subprocess.Popen[bytes] | None = None

    def __repr__(self) -> str:
        return f"<ManagedProcess {self.name} pid={self.pid} running={self.running}>"

    @property
    def pid(self) -> int | None:
        return None if self._popen is None else self._popen.pid

    @property
    def running(self) -> bool:
        return self._popen is not None and self._popen.poll() is None

    @property
    def exit_code(self) -> int | None:
        return None if self._popen is None else self._popen.poll()

    def start(self) -> None:
        if self.running:
            raise RuntimeError(f"{self.name} is already running (pid {self.pid})")
        self.log_path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self._popen = _on_lasting_thread(
                lambda: subprocess.Popen(
                    self.argv,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=self._env,
                    start_new_session=True,
                    preexec_fn=_death_signal_hook(os.getpid()),
                )
            )
        with _live_lock:
            _live.add(self)

    def _signal_group(self, signum: int) -> None:
        assert self._popen is not None
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self._popen.pid, signum)

    def stop(self, timeout: float = 15.0) -> None:
        """SIGTERM the group, wait up to ``timeout``, then SIGKILL; always reaps."""
        if self._popen is None:
            return
        if self._popen.poll() is None:
            self._signal_group(signal.SIGTERM)
            try:
                self._popen.wait(timeout)
            except subprocess.TimeoutExpired:
                self._signal_group(signal.SIGKILL)
                self._popen.wait()
        self._forget()

    def kill(self) -> None:
        """SIGKILL the group at once: an abrupt failure, for fault tests."""
        if self._popen is None:
            return
        self._signal_group(signal.SIGKILL)
        self._popen.wait()
        self._forget()

    def _forget(self) -> None:
        # Anything the child forked into its group goes down with it.
        if self._popen is not None:
            self._signal_group(signal.SIGKILL)
        with _live_lock:
            _live.discard(self)

    def log_tail(self, lines: int = 25) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""
        return "\n".join(text.splitlines()[-lines:])


def live_processes() -> list[ManagedProcess]:
    """Every child the testbed started and has not stopped yet."""
    with _live_lock:
        return [process for process in _live if process.running]


def wait_until(condition: Callable[[], bool], timeout: float, interval: float = 0.1) -> bool:
    """Poll ``condition`` until it holds or ``timeout`` passes; returns whether it held."""
    deadline = time.monotonic() + timeout
    while True:
        if condition():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)


@atexit.register
def _stop_all() -> None:
    for process in list(_live):
        process.kill()
