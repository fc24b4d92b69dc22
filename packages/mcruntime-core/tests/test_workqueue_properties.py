"""The work queue's properties: a model driven by random operations, and concurrent workers."""

from __future__ import annotations

import asyncio
import itertools
from collections import defaultdict

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)
from queue_helpers import FixedDelay, play
from test_workqueue import Request

from mcruntime._control.workqueue import QueueShutDown, WorkQueue

# -- properties: a model of the queue driven by random operations ------------------------------

CLUSTERS = ["east", "west", "north"]
requests = st.builds(Request, st.sampled_from(CLUSTERS), st.sampled_from(["a", "b", "c", "d"]))


class QueueModel(RuleBasedStateMachine):
    """Random add/get/done/purge/shutdown sequences against what the queue promises.

    The model tracks, per group, the order keys became ready (FIFO within a
    group), which keys workers hold, which held keys were added again, and for
    round-robin which groups were served since each waiting group last had its
    turn: while a group has ready keys, no other group is served twice before it.
    """

    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.queue = WorkQueue[Request](rate_limiter=FixedDelay(0.0))
        self.ready: dict[str, list[Request]] = {}
        self.held: set[Request] = set()
        self.added_while_held: set[Request] = set()
        self.purged_while_held: set[Request] = set()
        self.served_since_turn: dict[str, set[str]] = {}
        self.shut = False

    def teardown(self) -> None:
        self.loop.close()

    def _becomes_ready(self, key: Request) -> None:
        if key.cluster not in self.ready:
            self.ready[key.cluster] = []
            self.served_since_turn[key.cluster] = set()
        self.ready[key.cluster].append(key)

    def _model_add(self, key: Request, *, retry: bool = False) -> None:
        if self.shut or (retry and key in self.purged_while_held):
            return  # a held key's retry after its group was purged: the old engagement's
        if key in self.held:  # purged or not: a plain add is the group's (new) work
            self.added_while_held.add(key)
        elif key not in self.ready.get(key.cluster, []):
            self._becomes_ready(key)

    @rule(key=requests)
    def add(self, key: Request) -> None:
        self.queue.add(key)
        self._model_add(key)

    @rule(key=requests)
    def add_rate_limited(self, key: Request) -> None:
        self.queue.add_rate_limited(key)  # the limiter answers 0 s: added at once
        self._model_add(key, retry=True)

    @precondition(lambda self: bool(self.ready))
    @rule()
    def get(self) -> None:
        key = self.loop.run_until_complete(self.queue.get())
        group = key.cluster
        assert key not in self.held, "a key was handed to two workers at once"
        assert group in self.ready, "a key came from a group with nothing ready"
        assert self.ready[group][0] == key, "keys of one group came out of order"
        for other, served in self.served_since_turn.items():
            if other != group:
                assert group not in served, f"{group} served twice while {other} waited"
                served.add(group)
        self.ready[group].pop(0)
        if self.ready[group]:
            self.served_since_turn[group] = set()
        else:
            del self.ready[group]
            del self.served_since_turn[group]
        self.held.add(key)

    @precondition(lambda self: bool(self.held))
    @rule(data=st.data())
    def done(self, data: st.DataObject) -> None:
        key = data.draw(st.sampled_from(sorted(self.held)))
        self.queue.done(key)
        self.held.remove(key)
        self.purged_while_held.discard(key)
        if key in self.added_while_held:
            self.added_while_held.remove(key)
            self._becomes_ready(key)

    @rule(group=st.sampled_from(CLUSTERS))
    def purge(self, group: str) -> None:
        dropped = self.queue.purge(group)
        assert dropped == len(self.ready.pop(group, []))
        self.served_since_turn.pop(group, None)
        for key in self.held:
            if key.cluster == group:
                self.purged_while_held.add(key)
                self.added_while_held.discard(key)
        assert group not in self.queue.depth_by_group()

    @precondition(lambda self: not self.shut)
    @rule()
    def shut_down(self) -> None:
        self.queue.shut_down()
        self.shut = True

    @precondition(lambda self: self.shut and not self.ready)
    @rule()
    def get_after_shutdown(self) -> None:
        with pytest.raises(QueueShutDown):
            self.loop.run_until_complete(self.queue.get())

    @invariant()
    def counts_match_the_model(self) -> None:
        assert self.queue.depth_by_group() == {group: len(keys) for group, keys in self.ready.items()}
        assert len(self.queue) == sum(len(keys) for keys in self.ready.values())
        assert self.queue.processing_count == len(self.held)


def test_random_operation_sequences_keep_the_queue_promises() -> None:
    run_state_machine_as_test(
        QueueModel,
        settings=settings(max_examples=150, stateful_step_count=40, deadline=None),
    )


# -- properties: concurrent workers --------------------------------------------------------------

operations = st.lists(
    st.one_of(
        st.tuples(st.just("add"), requests),
        st.tuples(st.just("yield"), st.integers(min_value=1, max_value=3)),
    ),
    max_size=60,
)


async def _run_workers(steps: list[tuple[str, object]], workers: int, work_yields: int) -> None:
    queue = WorkQueue[Request]()
    ticks = itertools.count()
    last_added: dict[Request, int] = {}
    adds: dict[Request, int] = defaultdict(int)
    starts: dict[Request, list[int]] = defaultdict(list)
    in_flight: set[Request] = set()
    overlaps: list[Request] = []

    async def worker() -> None:
        while True:
            try:
                key = await queue.get()
            except QueueShutDown:
                return
            if key in in_flight:
                overlaps.append(key)
            in_flight.add(key)
            starts[key].append(next(ticks))
            for _ in range(work_yields):
                await asyncio.sleep(0)
            in_flight.discard(key)
            queue.done(key)

    tasks = [asyncio.create_task(worker()) for _ in range(workers)]
    await play(queue, steps, adds, last_added, ticks)
    async with asyncio.timeout(5):
        await asyncio.gather(*tasks)

    assert overlaps == [], "a key was processed by two workers at once"
    for key, added_at in last_added.items():
        assert starts[key], f"{key} was added but never processed"
        assert max(starts[key]) > added_at, f"{key} was added during processing and not processed again"
        assert len(starts[key]) <= adds[key], f"{key} was processed more often than added"
    assert (len(queue), queue.processing_count) == (0, 0)


@settings(max_examples=60, deadline=None)
@given(
    steps=operations,
    workers=st.integers(min_value=1, max_value=4),
    work_yields=st.integers(min_value=0, max_value=3),
)
def test_concurrent_workers_never_share_a_key_and_miss_no_add(
    steps: list[tuple[str, object]], workers: int, work_yields: int
) -> None:
    asyncio.run(_run_workers(steps, workers, work_yields))
