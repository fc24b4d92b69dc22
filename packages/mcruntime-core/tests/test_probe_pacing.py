"""Routine health probes share one budget per process; evidence of trouble is never paced.

Pure logic: the probe is a counting stand-in, the loop and the pacer are the real ones.
"""

from __future__ import annotations

import asyncio
from collections import Counter

import mcruntime as mcr
from mcruntime._client.health import HealthRecord, ProbePacer, probe_pacer
from mcruntime.testing import wait_until


def test_the_interval_stretches_only_once_the_fleet_outgrows_the_budget() -> None:
    pacer = ProbePacer()
    with pacer.member():
        assert pacer.interval(5.0, 50.0) == 5.0
    pacer.members = 250
    assert pacer.interval(5.0, 50.0) == 5.0
    pacer.members = 1000
    assert pacer.interval(5.0, 50.0) == 20.0
    assert pacer.interval(5.0, None) == 5.0


async def test_a_fleet_is_probed_within_its_budget_and_leaves_the_pacer_when_stopped() -> None:
    calls: Counter[str] = Counter()
    records = [HealthRecord(f"c{index}") for index in range(8)]

    def counting(name: str):  # type: ignore[no-untyped-def]
        async def probe(_timeout: float) -> None:
            calls[name] += 1

        return probe

    loops = [
        asyncio.create_task(
            record.probe_forever(
                counting(record.cluster), interval=0.01, timeout=1, backoff=mcr.Backoff(), budget=4
            )
        )
        for record in records
    ]
    await wait_until(lambda: len(calls) == 8)  # every cluster's first probe is immediate
    assert probe_pacer().members == 8
    first = sum(calls.values())
    await asyncio.sleep(1.0)  # a measuring window, not a synchronisation
    # 8 clusters at 4 probes/s: each waits 2 s between routine probes; unpaced, 100 each.
    assert sum(calls.values()) - first <= 8
    for loop in loops:
        loop.cancel()
    await asyncio.gather(*loops, return_exceptions=True)
    assert probe_pacer().members == 0


async def test_a_suspect_cluster_is_probed_at_once_however_thin_the_budget() -> None:
    calls = 0

    async def probe(_timeout: float) -> None:
        nonlocal calls
        calls += 1

    record = HealthRecord("c")
    loop = asyncio.create_task(
        record.probe_forever(probe, interval=0.01, timeout=1, backoff=mcr.Backoff(), budget=0.001)
    )
    await wait_until(lambda: calls == 1)  # then the next routine probe is 1,000 s away
    record.failure("a request timed out")
    await wait_until(lambda: calls == 2, timeout=3)
    loop.cancel()
    await asyncio.gather(loop, return_exceptions=True)
