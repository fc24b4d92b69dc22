"""``wait_started`` answers for a start that failed, instead of waiting for one that will not come."""

from __future__ import annotations

import asyncio
import socket

import pytest

import mcruntime as mcr


async def test_a_start_that_fails_is_raised_by_wait_started() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        address = f"127.0.0.1:{taken.getsockname()[1]}"
        manager = mcr.Manager(mcr.StaticProvider(), handle_signals=False, metrics_address=address)
        runner = asyncio.create_task(manager.start())
        with pytest.raises(OSError, match="address already in use"):
            await asyncio.wait_for(manager.wait_started(), timeout=30)
        with pytest.raises(OSError, match="cannot serve /metrics"):
            await runner
