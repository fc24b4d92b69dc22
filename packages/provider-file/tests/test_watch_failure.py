"""A directory watcher that fails is logged and started again; it does not leave changes to the rescan.

The watcher ran as a task nobody watched: had it died, the provider would
have gone on with the periodic rescan alone (30 s by default), and nothing
would have said so.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from file_helpers import dump, engaged, kubeconfig, provider_for, running, write_atomic

import mcruntime as mcr
from mcruntime.testing import Fleet, wait_until
from mcruntime_file._watch import DirectoryWatcher


async def test_a_failed_watcher_starts_again_and_sees_the_next_change(
    tmp_path: Path, fleet: Fleet, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    original = DirectoryWatcher._watch
    failing = [RuntimeError("a bug in the watcher")]

    async def fails_once(self: DirectoryWatcher, *args: object) -> None:
        if failing:
            raise failing.pop()
        await original(self, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(DirectoryWatcher, "_watch", fails_once)
    members = tmp_path / "members"
    write_atomic(members / "east.kubeconfig", dump(kubeconfig(("east", fleet["cluster-1"], None))))
    # No periodic rescan within the test: only the watch can see the second file.
    provider = provider_for(members, naming="context", rescan_interval=3600, backoff=mcr.Backoff(base=0.05))
    async with running(provider):
        await engaged(provider, "east")
        await wait_until(
            lambda: provider._watcher is not None and provider._watcher.crashes == 1, what="the failure"
        )
        write_atomic(members / "west.kubeconfig", dump(kubeconfig(("west", fleet["cluster-2"], None))))
        await engaged(provider, "west")
    failures = [
        r
        for r in caplog.records
        if r.levelno == logging.ERROR and "directory watcher failed" in r.getMessage()
    ]
    assert len(failures) == 1
    assert failures[0].getMessage().endswith("only the periodic rescan sees changes")
    assert failures[0].exc_info is not None
