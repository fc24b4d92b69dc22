"""The open-files limit: raised from soft to hard at manager start, never fatal."""

from __future__ import annotations

import json
import logging
import resource
import subprocess
import sys

import pytest

from mcruntime._base import limits as _limits

# A fresh interpreter: lower the soft limit, then run a manager (StaticProvider, no
# clusters) until it has started, and report the limits before and after.
_CHILD = """
import asyncio, json, resource
import mcruntime as mcr
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
low = min(256, hard)
resource.setrlimit(resource.RLIMIT_NOFILE, (low, hard))

async def main():
    manager = mcr.Manager(mcr.StaticProvider(), handle_signals=False)
    runner = asyncio.create_task(manager.start())
    await asyncio.wait_for(manager.wait_started(), 30)
    after = resource.getrlimit(resource.RLIMIT_NOFILE)
    manager.stop()
    await asyncio.wait_for(runner, 30)
    print(json.dumps({"low": low, "after": list(after), "hard": hard}))

asyncio.run(main())
"""


def test_manager_start_raises_the_soft_limit_to_the_hard_one() -> None:
    done = subprocess.run([sys.executable, "-c", _CHILD], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["after"] == [report["hard"], report["hard"]]
    if report["hard"] > report["low"]:  # the start really changed something
        assert report["after"][0] > report["low"]


def test_a_refused_raise_is_logged_and_not_fatal(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    monkeypatch.setattr(resource, "getrlimit", lambda _which: (min(soft, 128), max(hard, 129)))

    def refuse(_which: int, _limits: tuple[int, int]) -> None:
        raise ValueError("not allowed")

    monkeypatch.setattr(resource, "setrlimit", refuse)
    with caplog.at_level(logging.DEBUG, logger="mcruntime.limits"):
        assert _limits.raise_open_files_limit() is None
    assert "could not raise RLIMIT_NOFILE" in caplog.text
    assert "not allowed" in caplog.text


def test_a_limit_already_at_the_hard_one_is_left_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[int, int]] = []
    monkeypatch.setattr(resource, "getrlimit", lambda _which: (4096, 4096))
    monkeypatch.setattr(resource, "setrlimit", lambda _which, limits: calls.append(limits))
    assert _limits.raise_open_files_limit() == (4096, 4096)
    assert calls == []
