"""SIGTERM and SIGINT ask a running manager to stop gracefully, as a pod's termination does."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import threading
from collections.abc import Callable


def install_signal_handlers(on_signal: Callable[[int], None]) -> Callable[[], None]:
    """Route SIGTERM and SIGINT to ``on_signal`` on the running loop; returns what restores them.

    Only from the main thread (the only one that may set signal handlers);
    elsewhere, and on loops without signal support, nothing is installed.
    """
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    loop = asyncio.get_running_loop()
    installed = []
    for signum in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(signum, on_signal, signum)
            installed.append(signum)

    def restore() -> None:
        for signum in installed:
            loop.remove_signal_handler(signum)

    return restore
