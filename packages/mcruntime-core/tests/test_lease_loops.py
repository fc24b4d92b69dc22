"""The Lease loops (leader election, the sharding coordinator) never die.

A hub that does not serve the Lease kind, or answers with garbage, is logged
and retried with the loop's backoff; once the hub is sane again the loop
recovers (shown against a real API server, with the hub's client wrapped so
its first answers are broken). 5,000 consecutive failures go through each loop
with a zero-delay backoff, and the delay it asks for stays at its cap.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from kube_helpers import running_cluster, unique
from lease_helpers import FAST, LEASE, Seat, coordinating, liveness_through

import mcruntime as mcr
from mcruntime.coordination import LeaderElector
from mcruntime.testing import Fleet, wait_until


class Broken:
    """A hub client whose first answers are broken, then the real client's.

    ``missing`` calls raise ``KindNotFound`` (the hub serves no Lease kind),
    the next ``garbage`` calls return a body that is no Lease at all.
    """

    def __init__(self, real: mcr.Client, *, missing: int = 0, garbage: int = 0) -> None:
        self._real = real
        self.missing = missing
        self.garbage = garbage

    def _broken(self) -> Any:
        if self.missing > 0:
            self.missing -= 1
            raise mcr.KindNotFound("hub", "coordination.k8s.io/v1", "Lease")
        if self.garbage > 0:
            self.garbage -= 1
            return ["<html>502 Bad Gateway</html>"]
        return None

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._real, name)

        async def call(*args: Any, **kwargs: Any) -> Any:
            broken = self._broken()
            if broken is not None:
                return broken
            return await method(*args, **kwargs)

        return call


class Recording(mcr.Backoff):
    """The default backoff's delays, recorded and not slept."""

    def __init__(self) -> None:
        super().__init__()
        object.__setattr__(self, "delays", [])

    def delay(self, failures: int) -> float:
        chosen = mcr.Backoff(base=0.2, cap=30.0).delay(failures)
        self.delays.append(chosen)  # type: ignore[attr-defined]
        return 0.0


class AlwaysFailing:
    """A hub client that fails every call with an error no loop expects."""

    def __getattr__(self, name: str) -> Any:
        async def call(*_args: Any, **_kwargs: Any) -> Any:
            raise ValueError("the hub answered something that is not JSON")

        return call


async def test_leader_election_survives_a_missing_lease_kind_and_garbage_and_leads(
    fleet: Fleet, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, "mcruntime.leaderelection")
    async with running_cluster(fleet["cluster-1"], "elector") as cluster:
        real = cluster.client
        cluster.client = Broken(real, missing=3, garbage=3)  # type: ignore[assignment]
        name = unique("broken-lease")
        elector = LeaderElector(
            mcr.LeaderElectionConfig(name=name, identity="survivor", **FAST), backoff=mcr.Backoff(0.01, 0.05)
        )
        # The leader renews from its heartbeat's thread, on a connection of its own: break that one.
        renewal_broken = False

        def switchable(client: mcr.Client) -> Any:
            broken = Broken(client, garbage=10**6)

            class Switch:
                def __getattr__(self, name: str) -> Any:
                    return getattr(broken if renewal_broken else client, name)

            return Switch()

        elector._liveness = liveness_through(cluster, switchable)
        task = asyncio.create_task(elector.run(cluster))
        try:
            await asyncio.wait_for(elector.leading.wait(), 20)
            lease = await real.get(LEASE, name, namespace="default")
            assert lease["spec"]["holderIdentity"] == "survivor"
            assert "KindNotFound" in caplog.text and "6 in a row" in caplog.text
            cluster.client = real
            await wait_until(lambda: elector.renewals >= 2, timeout=20)  # renewed by the thread
            # Broken again while leading: it steps down within the renew deadline, then leads again.
            # (Waiting on the log, not on ``leading``: the campaign on the unbroken client wins
            # again at once, so the step-down can be shorter than any poll.)
            assert "lost leadership" not in caplog.text
            renewal_broken = True
            await wait_until(lambda: "lost leadership" in caplog.text, timeout=10)
            renewal_broken = False
            await asyncio.wait_for(elector.leading.wait(), 20)
            assert not task.done()
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


async def test_leader_election_survives_5000_consecutive_failures_at_its_cap() -> None:
    backoff = Recording()
    elector = LeaderElector(mcr.LeaderElectionConfig(name="x", identity="me", **FAST), backoff=backoff)

    class Hub:
        client = AlwaysFailing()

    logging.getLogger("mcruntime.leaderelection").disabled = True
    task = asyncio.create_task(elector.run(Hub()))  # type: ignore[arg-type]
    try:
        await wait_until(lambda: len(backoff.delays) >= 5000, timeout=60)  # type: ignore[attr-defined]
        assert not task.done()
        assert elector.failures >= 5000
    finally:
        logging.getLogger("mcruntime.leaderelection").disabled = False
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    delays: list[float] = backoff.delays  # type: ignore[attr-defined]
    assert max(delays) <= 30.0 and min(delays[-100:]) >= 15.0  # at its cap, jittered


@contextlib.asynccontextmanager
async def hub_wrapped(
    fleet: Fleet, group: str, wrap: Callable[[mcr.Client], Any]
) -> AsyncIterator[tuple[mcr.Client, mcr.ShardedCoordinator, Seat]]:
    """A real hub whose client is ``wrap``'s, a fast coordinator for ``group`` there, and its seat.

    Yields the hub's real client too, to read what was written.
    """
    namespace = unique(group)
    async with running_cluster(fleet["cluster-1"], "hub") as hub:
        await hub.client.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
        real = hub.client
        hub.client = wrap(real)
        coordinator = mcr.ShardedCoordinator(
            mcr.ShardingConfig(name=group, namespace=namespace, identity="survivor", **FAST),
            backoff=mcr.Backoff(0.01, 0.05),
        )
        try:
            yield real, coordinator, Seat(hub, ["", "x"])
        finally:
            hub.client = real


async def test_the_coordinator_survives_a_missing_lease_kind_and_garbage_and_shards(
    fleet: Fleet, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, "mcruntime.sharding")

    def broken(client: mcr.Client) -> Broken:
        return Broken(client, missing=3, garbage=3)

    async with hub_wrapped(fleet, "broken-shards", broken) as (real, coordinator, seat):
        # The peer renewals (on the heartbeat's own connection) get broken answers too.
        coordinator._liveness = liveness_through(seat.local, broken)
        async with coordinating(coordinator, seat) as task:
            # Work opens as the round that took the fences ends: wait for both.
            await wait_until(
                lambda: coordinator.owned == {"", "x"} and seat.work.opened == {"", "x"}, timeout=30
            )
            assert (seat.registry.get_sample_value("mcruntime_shard_loop_failures_total") or 0) >= 6
            assert "KindNotFound" in caplog.text
            assert not task.done()
        # Stopped: every fence and the peer Lease were given back.
        leases = await real.list(LEASE, namespace=coordinator.config.namespace)
        assert {item["spec"].get("holderIdentity") for item in leases.items} == {""}


class GarbledFence:
    """A hub client that answers the creation of one cluster's fence (its shard's) with garbage, always."""

    def __init__(self, real: mcr.Client, group: str, cluster: str) -> None:
        self._real = real
        self._fence = mcr.ShardingConfig(name=group).fence_lease(cluster)

    async def create(self, obj: Any, **kwargs: Any) -> Any:
        if obj.get("metadata", {}).get("name") == self._fence:
            return ["<html>502 Bad Gateway</html>"]
        return await self._real.create(obj, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


async def test_a_fence_that_cannot_be_taken_does_not_keep_the_won_ones_from_working(
    fleet: Fleet, caplog: pytest.LogCaptureFixture
) -> None:
    """Every round fails on the fence of "x"; the fence of "" is held, so its work opens all the same."""
    caplog.set_level(logging.WARNING, "mcruntime.sharding")
    garbled = hub_wrapped(fleet, "garbled-fence", lambda client: GarbledFence(client, "garbled-fence", "x"))
    async with garbled as (_, coordinator, seat), coordinating(coordinator, seat) as task:
        await wait_until(lambda: seat.work.opened == {""}, timeout=30)
        await wait_until(
            lambda: (seat.registry.get_sample_value("mcruntime_shard_loop_failures_total") or 0) >= 2,
            timeout=30,
        )
        assert coordinator.owned == {""} and seat.work.opened == {""}
        assert "the hub answered a Lease write (fence-acquire) with no Lease" in caplog.text
        assert not task.done()


async def test_the_coordinator_survives_5000_consecutive_failures_at_its_cap() -> None:
    backoff = Recording()
    coordinator = mcr.ShardedCoordinator(mcr.ShardingConfig(identity="me", **FAST), backoff=backoff)
    coordinator._liveness = lambda: contextlib.nullcontext(AlwaysFailing())  # type: ignore[arg-type]

    class Informer:
        async def wait_for_sync(self, _timeout: float) -> bool:
            return True

        def add_handler(self, _handler: object) -> Any:
            class Registration:
                def remove(self) -> None:
                    pass

            return Registration()

    class Cache:
        def informer(self, *_args: Any, **_kwargs: Any) -> Informer:
            return Informer()

    class Hub:
        client = AlwaysFailing()
        cache = Cache()

    logging.getLogger("mcruntime.sharding").disabled = True
    try:
        async with coordinating(coordinator, Seat(Hub(), ["a"])) as task:
            await wait_until(lambda: len(backoff.delays) >= 5000, timeout=60)  # type: ignore[attr-defined]
            assert not task.done()
            assert coordinator.renew_failures >= 5000
    finally:
        logging.getLogger("mcruntime.sharding").disabled = False
    delays: list[float] = backoff.delays  # type: ignore[attr-defined]
    assert max(delays) <= 30.0 and min(delays[-100:]) >= 15.0
