"""The work gate's cut: writes in a cluster whose work was lost are refused at once, and only there.

Pure logic: the gate is driven directly, with stand-in controllers whose
release waits until the test lets it end. (A real replica losing a shard
under a running reconcile is in test_lapses.py.)
"""

from __future__ import annotations

import asyncio
from typing import Any, cast

import mcruntime as mcr
from mcruntime._coordination.coordinator import WorkGate
from mcruntime._reconcile.context import enter_reconcile, leave_reconcile


class HeldRelease:
    """A controller stand-in: ``release`` ends when the test sets ``done``; ``replay`` is recorded."""

    def __init__(self) -> None:
        self.done = asyncio.Event()
        self.entered = asyncio.Event()
        self.released: list[str] = []
        self.replayed: list[set[str]] = []

    async def release(self, cluster: str, grace: float = 0.0) -> None:
        self.released.append(cluster)
        self.entered.set()
        await self.done.wait()

    def replay(self, clusters: set[str]) -> None:
        self.replayed.append(clusters)


def gate_over(controller: HeldRelease) -> WorkGate:
    return WorkGate(lambda: [cast("Any", controller)])


def refusal_in(gate: WorkGate, cluster: str) -> str | None:
    """The gate's answer from inside a reconcile of ``cluster`` (where the transport asks it)."""
    token = enter_reconcile("c", mcr.Request(cluster, "ns", "x"))
    try:
        return gate.refusal()
    finally:
        leave_reconcile(token)


async def test_a_cut_refuses_writes_in_its_cluster_alone_until_its_close_ends() -> None:
    controller = HeldRelease()
    gate = gate_over(controller)
    gate.open("a", "b")
    gate.cut(["a"], "shard group 'g' lost shard 3 (its fence is now held by other)")
    assert not gate.admits("a") and gate.admits("b")
    reason = refusal_in(gate, "a")
    assert reason == "cluster 'a': shard group 'g' lost shard 3 (its fence is now held by other)"
    assert refusal_in(gate, "b") is None
    assert gate.refusal() is None  # outside any reconcile: the coordinator's own writes go
    closing = asyncio.create_task(gate.close("a"))
    await controller.entered.wait()  # the close has started its release: its reconciles still run
    assert controller.released == ["a"]
    assert refusal_in(gate, "a") == reason
    controller.done.set()
    await closing
    assert refusal_in(gate, "a") is None
    assert gate._cuts == {}


async def test_the_coordinators_check_comes_first_and_opening_lifts_a_cut() -> None:
    controller = HeldRelease()
    gate = gate_over(controller)
    gate.guard(lambda: "this replica lapsed")
    gate.cut(["a"], "lost")
    assert refusal_in(gate, "a") == "this replica lapsed"
    gate.guard(None)
    gate.open("a")  # taken back: the work is ours again, and so are its writes
    assert controller.replayed == [{"a"}]
    assert refusal_in(gate, "a") is None
    assert gate._cuts == {}


async def test_a_close_lifts_only_the_cut_it_found() -> None:
    controller = HeldRelease()
    gate = gate_over(controller)
    gate.cut(["a"], "first loss")
    first = asyncio.create_task(gate.close("a"))
    await controller.entered.wait()  # the first close holds the first mark
    gate.open("a")  # taken back, then lost again while the first close still waits
    gate.cut(["a"], "second loss")
    controller.done.set()
    await first
    assert refusal_in(gate, "a") == "cluster 'a': second loss"
    await gate.close("a")
    assert refusal_in(gate, "a") is None
