"""The provider conformance suite: the provider contract, checked against real clusters.

Every provider, ours or yours, must behave the same at the edges: engage what
appears, re-engage exactly once on a real change and never on a non-change,
keep a broken cluster present and unhealthy without disturbing the others,
release everything on removal, and converge after churn. This module checks
all of it with a few lines in the provider's own tests::

    import pytest
    from mcruntime.testing.conformance import ProviderConformance, ProviderDriver


    class MyDriver(ProviderDriver):
        ...  # edit the provider's source: add, change, remove; build the provider


    class TestMyProvider(ProviderConformance):
        @pytest.fixture
        def driver(self, fleet):
            return MyDriver(...)

Each ``test_*`` method of :class:`ProviderConformance` is one case; pytest
collects them in every subclass whose name starts with ``Test``. The cases use
the ``fleet`` fixture of mcruntime's pytest plugin (three shared control
planes) and never break a control plane itself: a broken cluster is a broken
*description* of one (a closed port, a foreign CA, an unknown token), so the
session's clusters stay shared. A case that needs a capability the driver
lists in :attr:`ProviderDriver.unsupported` is skipped with the driver's
reason. See the guide ``docs/guides/writing-a-provider.md`` (repository root) for the whole story.
"""

from __future__ import annotations

import asyncio
import hmac
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pytest
import pytest_asyncio

import mcruntime as mcr

from ._controlplane import ControlPlane, User
from ._driver import Breakage, Capability, ProviderDriver, Target
from ._fleet import Fleet
from ._harness import (
    CONFIGMAP,
    EngagementRecorder,
    Seeder,
    Seen,
    running,
    seed_index,
)
from ._running import wait_until

__all__ = [
    "CLUSTER_OPTIONS",
    "PROBE_INTERVAL",
    "Breakage",
    "Capability",
    "ProviderConformance",
    "ProviderDriver",
    "Target",
    "wait_until",
]

CLUSTER_OPTIONS = mcr.ClusterOptions(
    request_timeout=10.0,
    watch_read_timeout=10.0,
    cache_sync_timeout=10.0,
    retry=mcr.RetryPolicy(attempts=1),
)
"""Cluster options for providers under test: no retries, so dead endpoints fail fast."""

PROBE_INTERVAL = 0.2
"""Health probe interval for providers under test, so unhealthy shows within a second."""


def _require(driver: ProviderDriver, *capabilities: Capability) -> None:
    for capability in capabilities:
        reason = driver.unsupported.get(capability)
        if reason is not None:
            pytest.skip(f"{type(driver).__name__}: no {capability.name}: {reason}")


def _supports(driver: ProviderDriver, capability: Capability) -> bool:
    return capability not in driver.unsupported


def _same_secret(actual: str | None, expected: str) -> bool:
    """Compare credentials without letting either reach an assertion message."""
    return actual is not None and hmac.compare_digest(actual.encode(), expected.encode())


@dataclass
class _Case:
    """One case's running world: the driver, the provider, the manager and the observers."""

    driver: ProviderDriver
    seeder: Seeder
    recorder: EngagementRecorder
    seen: Seen
    provider: mcr.Provider | None = None
    manager: mcr.Manager | None = None

    @property
    def namespace(self) -> str:
        return self.seeder.namespace

    def name(self, source_name: str) -> str:
        return self.driver.engaged_name(source_name)

    def build(self) -> tuple[mcr.Provider, mcr.Manager]:
        """A provider from the source as it is, and a manager with the case's controller."""
        provider = self.driver.build()
        manager = mcr.Manager(provider, handle_signals=False)
        manager.add(self.recorder)
        mcr.controller_managed_by(manager).named("conformance").for_(
            CONFIGMAP, predicates=[mcr.in_namespaces(self.namespace)]
        ).complete(self.seen.reconciler(manager))
        self.provider, self.manager = provider, manager
        return provider, manager

    @asynccontextmanager
    async def running(self) -> AsyncIterator[tuple[mcr.Provider, mcr.Manager]]:
        provider, manager = self.build()
        async with running(manager, self.recorder):
            yield provider, manager

    def engaged_names(self) -> set[str]:
        assert self.manager is not None
        return {name for name in self.manager.clusters() if name != mcr.LOCAL_CLUSTER}

    async def engaged(self, source_name: str) -> mcr.Cluster:
        """Wait until ``source_name`` is engaged with the manager; return its cluster."""
        assert self.manager is not None
        manager, name = self.manager, self.name(source_name)
        await wait_until(lambda: name in manager.clusters(), what=f"cluster {name!r} engaged")
        return manager.clusters()[name]

    async def reconciled(self, source_name: str, plane: ControlPlane, configmap: str) -> None:
        """Wait until the reconciler read ``configmap`` from ``plane`` under the cluster's name."""
        key = (self.name(source_name), self.namespace, configmap)
        await wait_until(
            lambda: self.seen.objects.get(key) == plane.name,
            what=f"ConfigMap {configmap!r} of {plane.name} reconciled as cluster {key[0]!r}",
        )

    async def phase(self, source_name: str, state: mcr.ClusterPhase) -> mcr.ClusterStatus:
        """Wait until the provider reports ``source_name`` in ``state``; return the status."""
        driver = self.driver

        def reached() -> bool:
            status = driver.status(source_name)
            return status is not None and status.phase is state

        await wait_until(reached, what=f"cluster {source_name!r} reported {state.value}")
        status = driver.status(source_name)
        assert status is not None
        return status

    async def serving(self, source_name: str, plane: ControlPlane) -> mcr.Cluster:
        """Wait until ``source_name`` is engaged with a cluster whose server is ``plane``'s."""
        assert self.manager is not None
        manager, name = self.manager, self.name(source_name)

        def pointed() -> bool:
            cluster = manager.clusters().get(name)
            return cluster is not None and cluster.config.server == plane.server

        await wait_until(pointed, what=f"cluster {name!r} engaged with {plane.name}")
        return manager.clusters()[name]


@pytest.mark.asyncio
class ProviderConformance:
    """The conformance cases; subclass it as ``Test<YourProvider>`` and define ``driver``.

    The subclass provides a function-scoped ``driver`` fixture returning a
    fresh :class:`ProviderDriver` over an empty source. Cases use the three
    clusters of the session's ``fleet`` fixture; each works in a namespace of
    its own and cleans up everything it started. The cases are marked for
    pytest-asyncio, so they run in its strict mode as in its auto mode.
    """

    if TYPE_CHECKING:
        # Any fixture will do, sync or async (``pytest_asyncio.fixture``), so
        # type checkers accept both kinds of override.
        driver: Any
    else:

        @pytest.fixture
        def driver(self) -> ProviderDriver:
            """Override in the subclass: a new driver whose source holds no cluster yet."""
            raise NotImplementedError(f"{type(self).__name__} must define a `driver` fixture")

    @pytest_asyncio.fixture
    async def case(self, driver: ProviderDriver) -> AsyncIterator[_Case]:
        """The case's namespace, observers and manager wiring around the driver."""
        seeder = Seeder()
        driver.use_namespace(seeder.namespace)
        try:
            yield _Case(driver, seeder, EngagementRecorder(), Seen())
        finally:
            await seeder.close()

    # --- engage, get, names --------------------------------------------------------------

    async def test_engages_on_add_and_reconciles_against_the_right_cluster(
        self, case: _Case, fleet: Fleet
    ) -> None:
        """Clusters in the source are engaged, served by ``get``, and reconciled by name.

        A cluster added while the provider runs is engaged too; ``get`` raises
        before it appears and returns the manager's object after.
        """
        driver = case.driver
        first, second = fleet["cluster-1"], fleet["cluster-2"]
        await case.seeder.configmap(first, "marker")
        await case.seeder.configmap(second, "marker")
        await driver.add("alpha", Target.of(first))
        async with case.running() as (provider, manager):
            alpha = await case.engaged("alpha")
            assert await provider.get(case.name("alpha")) is alpha
            assert await manager.get_cluster(case.name("alpha")) is alpha
            await case.reconciled("alpha", first, "marker")
            await case.phase("alpha", mcr.ClusterPhase.READY)
            if not (
                _supports(driver, Capability.RUNTIME_CHANGES)
                and _supports(driver, Capability.MULTIPLE_CLUSTERS)
            ):
                return
            with pytest.raises(mcr.ClusterNotFound):
                await provider.get(case.name("beta"))
            await driver.add("beta", Target.of(second))
            beta = await case.engaged("beta")
            assert await provider.get(case.name("beta")) is beta
            await case.reconciled("beta", second, "marker")
            assert case.engaged_names() == {case.name("alpha"), case.name("beta")}

    async def test_an_unknown_name_raises_cluster_not_found(self, case: _Case, fleet: Fleet) -> None:
        """``get`` of a name the source never held raises ``ClusterNotFound`` naming it."""
        await case.driver.add("alpha", Target.of(fleet["cluster-1"]))
        async with case.running() as (provider, manager):
            await case.engaged("alpha")
            for unknown in (case.name("no-such-cluster"), "no-such-cluster", "no/such/cluster", ""):
                if unknown in manager.clusters():
                    continue  # the local cluster's "" is not a provider name
                with pytest.raises(mcr.ClusterNotFound) as raised:
                    await provider.get(unknown)
                assert raised.value.cluster == unknown
                with pytest.raises(mcr.ClusterNotFound):
                    await manager.get_cluster(unknown)

    async def test_names_are_stable_across_providers_over_the_same_source(
        self, case: _Case, fleet: Fleet
    ) -> None:
        """Two providers over one source engage the same names, the ones the driver documents."""
        driver = case.driver
        names = ["alpha", "beta"] if _supports(driver, Capability.MULTIPLE_CLUSTERS) else ["alpha"]
        for source_name, plane in zip(names, fleet, strict=False):
            await driver.add(source_name, Target.of(plane))
        expected = {case.name(source_name) for source_name in names}
        rounds: list[set[str]] = []
        for _round in range(2):
            async with case.running():
                for source_name in names:
                    await case.engaged(source_name)
                await driver.settle()
                rounds.append(case.engaged_names())
        assert rounds == [expected, expected]

    async def test_duplicate_names_are_reported_and_never_shadow(self, case: _Case, fleet: Fleet) -> None:
        """A second source entry claiming a taken name is reported; the engaged cluster stays."""
        driver = case.driver
        _require(driver, Capability.DUPLICATE_NAMES, Capability.RUNTIME_CHANGES)
        first, second = fleet["cluster-1"], fleet["cluster-2"]
        await case.seeder.configmap(first, "marker")
        await driver.add("alpha", Target.of(first))
        async with case.running():
            original = await case.serving("alpha", first)
            await driver.add_duplicate("alpha", Target.of(second))
            await driver.settle()
            await wait_until(lambda: driver.duplicate_reported("alpha"), what="the duplicate reported")
            assert (await case.engaged("alpha")) is original
            assert original.config.server == first.server and not original.stopped
            assert case.recorder.count(case.name("alpha")) == 1
            await case.reconciled("alpha", first, "marker")

    # --- change detection ----------------------------------------------------------------

    async def test_a_changed_connection_re_engages_exactly_once(self, case: _Case, fleet: Fleet) -> None:
        """Pointing a cluster at another API server engages a new cluster object, once."""
        driver = case.driver
        _require(driver, Capability.RUNTIME_CHANGES, Capability.OWN_CONNECTION)
        first, second = fleet["cluster-1"], fleet["cluster-2"]
        await case.seeder.configmap(first, "marker")
        await case.seeder.configmap(second, "marker")
        await driver.add("alpha", Target.of(first))
        async with case.running():
            old = await case.serving("alpha", first)
            await case.reconciled("alpha", first, "marker")
            await driver.change("alpha", Target.of(second))
            new = await case.serving("alpha", second)
            await case.reconciled("alpha", second, "marker")
            await driver.settle()
            assert new is not old
            assert old.stopped and len(old.tasks) == 0 and old.transport.closed
            assert case.recorder.count(case.name("alpha")) == 2
            status = driver.status("alpha")
            assert status is not None and status.engagements == 2

    async def test_an_unchanged_source_never_re_engages(self, case: _Case, fleet: Fleet) -> None:
        """Re-stating the same content, and health probes going by, keep the same cluster object."""
        driver = case.driver
        plane = fleet["cluster-1"]
        await driver.add("alpha", Target.of(plane))
        async with case.running():
            cluster = await case.engaged("alpha")
            await case.phase("alpha", mcr.ClusterPhase.READY)  # at least one probe went by
            if _supports(driver, Capability.RUNTIME_CHANGES):
                for _touch in range(2):
                    await driver.touch("alpha", Target.of(plane))
                    await driver.settle()
            await driver.settle()
            assert (await case.engaged("alpha")) is cluster
            assert not cluster.stopped
            assert case.recorder.count(case.name("alpha")) == 1
            status = driver.status("alpha")
            assert status is not None and status.engagements == 1

    async def test_a_credential_change_is_used_from_then_on(self, case: _Case, fleet: Fleet) -> None:
        """A new token for the same API server is used, in place or by one re-engagement."""
        driver = case.driver
        _require(driver, Capability.RUNTIME_CHANGES, Capability.CREDENTIAL_CHANGE)
        plane = fleet["cluster-3"]
        before, after = _token_user(plane, case, "before"), _token_user(plane, case, "after")
        assert after.token is not None
        await case.seeder.configmap(plane, "marker")
        await driver.add("alpha", Target.of(plane, before))
        async with case.running():
            await case.engaged("alpha")
            await case.reconciled("alpha", plane, "marker")
            await driver.change_credential("alpha", Target.of(plane, after))

            async def uses_new_credential() -> bool:
                cluster = await case.engaged("alpha")
                return _same_secret(await cluster.transport.authorization(), f"Bearer {after.token}")

            await wait_until(uses_new_credential, what="the new credential in use")
            await driver.settle()
            assert case.recorder.count(case.name("alpha")) <= 2, "more than one re-engagement"
            await case.seeder.configmap(plane, "after-rotation")
            await case.reconciled("alpha", plane, "after-rotation")
            await case.phase("alpha", mcr.ClusterPhase.READY)

    # --- removal -------------------------------------------------------------------------

    async def test_removal_disengages_and_releases_everything(self, case: _Case, fleet: Fleet) -> None:
        """A cluster gone from the source is stopped, forgotten and reconciled no more."""
        driver = case.driver
        _require(driver, Capability.RUNTIME_CHANGES)
        first, second = fleet["cluster-1"], fleet["cluster-2"]
        others = _supports(driver, Capability.MULTIPLE_CLUSTERS)
        await case.seeder.configmap(first, "marker")
        await driver.add("alpha", Target.of(first))
        if others:
            await case.seeder.configmap(second, "marker")
            await driver.add("beta", Target.of(second))
        async with case.running() as (provider, manager):
            removed = await case.engaged("alpha")
            await case.reconciled("alpha", first, "marker")
            if others:
                await case.reconciled("beta", second, "marker")
            await driver.remove("alpha")
            name = case.name("alpha")
            await wait_until(lambda: name not in manager.clusters(), what=f"{name!r} disengaged")
            await driver.settle()
            assert removed.stopped and len(removed.tasks) == 0
            if _supports(driver, Capability.OWN_CONNECTION):  # else it shares a connection it may not close
                assert removed.transport.closed
            assert driver.status("alpha") is None
            with pytest.raises(mcr.ClusterNotFound):
                await provider.get(name)
            with pytest.raises(mcr.ClusterNotFound):
                await manager.get_cluster(name)
            if others:
                calls = case.seen.calls[name]
                await case.seeder.configmap(first, "after-removal")
                await case.seeder.configmap(second, "after-removal")
                await case.reconciled("beta", second, "after-removal")  # the others go on
                assert case.seen.calls[name] == calls
                assert (name, case.namespace, "after-removal") not in case.seen.objects
                assert case.engaged_names() == {case.name("beta")}

    # --- broken clusters -----------------------------------------------------------------

    @pytest.mark.parametrize("breakage", list(Breakage), ids=[b.value for b in Breakage])
    async def test_a_broken_cluster_is_unhealthy_present_and_isolated(
        self, case: _Case, fleet: Fleet, breakage: Breakage
    ) -> None:
        """A cluster that cannot be used is reported unhealthy, kept, and disturbs no other."""
        driver = case.driver
        _require(driver, Capability.OWN_CONNECTION)
        healthy, broken_plane = fleet["cluster-1"], fleet["cluster-2"]
        others = _supports(driver, Capability.MULTIPLE_CLUSTERS)
        broken_name = "beta" if others else "alpha"
        broken = Target.of(broken_plane, breakage=breakage)
        if others:
            await case.seeder.configmap(healthy, "marker")
            await driver.add("alpha", Target.of(healthy))
        await driver.add(broken_name, broken)
        async with case.running() as (provider, manager):
            status = await case.phase(broken_name, mcr.ClusterPhase.UNHEALTHY)
            assert status.error, "an unhealthy cluster says why"
            _assert_no_secret(status.error, broken, broken_plane.token_user)
            cluster = await case.engaged(broken_name)  # unavailable is not gone
            assert await provider.get(case.name(broken_name)) is cluster
            _assert_no_secret(repr(cluster) + repr(cluster.config), broken, broken_plane.token_user)
            if others:
                await case.reconciled("alpha", healthy, "marker")
                await case.seeder.configmap(healthy, "while-broken")
                await case.reconciled("alpha", healthy, "while-broken")
                await case.phase("alpha", mcr.ClusterPhase.READY)
            still = driver.status(broken_name)
            assert still is not None and still.phase is mcr.ClusterPhase.UNHEALTHY
            assert case.name(broken_name) in manager.clusters()

    async def test_a_cluster_broken_while_running_stays_and_recovers(self, case: _Case, fleet: Fleet) -> None:
        """Breaking a running cluster makes it unhealthy, not gone; fixing it makes it ready."""
        driver = case.driver
        _require(driver, Capability.RUNTIME_CHANGES, Capability.OWN_CONNECTION)
        first, second = fleet["cluster-1"], fleet["cluster-2"]
        others = _supports(driver, Capability.MULTIPLE_CLUSTERS)
        await case.seeder.configmap(first, "marker")
        await driver.add("alpha", Target.of(first))
        if others:
            await case.seeder.configmap(second, "marker")
            await driver.add("beta", Target.of(second))
        async with case.running() as (provider, _manager):
            await case.reconciled("alpha", first, "marker")
            await driver.break_cluster("alpha", Target.of(first, breakage=Breakage.UNREACHABLE))
            await case.phase("alpha", mcr.ClusterPhase.UNHEALTHY)
            await case.engaged("alpha")
            await provider.get(case.name("alpha"))
            if others:
                await case.seeder.configmap(second, "while-broken")
                await case.reconciled("beta", second, "while-broken")
            await driver.change("alpha", Target.of(first))
            await case.serving("alpha", first)
            await case.phase("alpha", mcr.ClusterPhase.READY)
            await case.seeder.configmap(first, "after-repair")
            await case.reconciled("alpha", first, "after-repair")

    # --- indexes -------------------------------------------------------------------------

    async def test_field_indexes_apply_whenever_they_are_registered(self, case: _Case, fleet: Fleet) -> None:
        """An index registered before a cluster is engaged, and one after, both apply to it."""
        driver = case.driver
        first, second = fleet["cluster-1"], fleet["cluster-2"]
        await case.seeder.configmap(first, "indexed")
        await driver.add("alpha", Target.of(first))
        provider, manager = case.build()
        await provider.index_field(CONFIGMAP, "conformance-early", seed_index)
        async with running(manager, case.recorder):
            alpha = await case.engaged("alpha")
            await provider.index_field(CONFIGMAP, "conformance-late", seed_index)
            await _assert_indexed(alpha, case.seeder.token, ["indexed"])
            if not (
                _supports(driver, Capability.RUNTIME_CHANGES)
                and _supports(driver, Capability.MULTIPLE_CLUSTERS)
            ):
                return
            await case.seeder.configmap(second, "indexed")
            await driver.add("beta", Target.of(second))
            await _assert_indexed(await case.engaged("beta"), case.seeder.token, ["indexed"])

    # --- churn ---------------------------------------------------------------------------

    async def test_the_engaged_set_converges_after_churn(self, case: _Case, fleet: Fleet) -> None:
        """After a burst of adds, changes and removals, what is engaged is what the source says."""
        driver = case.driver
        _require(driver, Capability.RUNTIME_CHANGES, Capability.MULTIPLE_CLUSTERS)
        p1, p2, p3 = fleet["cluster-1"], fleet["cluster-2"], fleet["cluster-3"]
        for plane in (p1, p2, p3):
            await case.seeder.configmap(plane, "marker")
        await driver.add("alpha", Target.of(p1))
        await driver.add("beta", Target.of(p2))
        async with case.running() as (provider, manager):
            await case.engaged("alpha")
            await case.engaged("beta")

            async def alpha() -> None:
                await driver.change("alpha", Target.of(p2))
                await driver.change("alpha", Target.of(p3))

            async def beta() -> None:
                await driver.remove("beta")
                await driver.add("beta", Target.of(p3))

            async def gamma() -> None:
                await driver.add("gamma", Target.of(p3))
                await driver.remove("gamma")
                await driver.add("gamma", Target.of(p1))

            async def delta() -> None:
                await driver.add("delta", Target.of(p2))

            async def epsilon() -> None:
                await driver.add("epsilon", Target.of(p1))
                await driver.change("epsilon", Target.of(p3))
                await driver.remove("epsilon")

            await asyncio.gather(alpha(), beta(), gamma(), delta(), epsilon())
            await driver.settle()
            expected = {"alpha": p3, "beta": p3, "gamma": p1, "delta": p2}
            await wait_until(
                lambda: case.engaged_names() == {case.name(n) for n in expected},
                what=f"the engaged set to become {sorted(case.name(n) for n in expected)}",
            )
            for source_name, plane in expected.items():
                await case.serving(source_name, plane)
                await case.reconciled(source_name, plane, "marker")
                await case.phase(source_name, mcr.ClusterPhase.READY)
            with pytest.raises(mcr.ClusterNotFound):
                await provider.get(case.name("epsilon"))
            assert driver.status("epsilon") is None
            current = set(map(id, manager.clusters().values()))

            def replaced_all_stopped() -> bool:
                return all(c.stopped for _n, c in case.recorder.every_cluster() if id(c) not in current)

            await wait_until(replaced_all_stopped, what="every replaced or removed cluster stopped")


def _token_user(plane: ControlPlane, case: _Case, role: str) -> User:
    return plane.add_token_user(f"conformance-{case.seeder.token}-{role}")


def _assert_no_secret(text: str, target: Target, *users: User) -> None:
    tokens = [token for token in (target.token, *(user.token for user in users)) if token]
    leaked = any(token in text for token in tokens)
    assert not leaked, "a credential appears in a status, error or repr"


async def _assert_indexed(cluster: mcr.Cluster, token: str, names: Sequence[str]) -> None:
    for index in ("conformance-early", "conformance-late"):
        found = await cluster.cache.list(CONFIGMAP, index=(index, token))
        assert sorted(obj["metadata"]["name"] for obj in found) == sorted(names), (
            f"index {index!r} in cluster {cluster.name!r}"
        )
