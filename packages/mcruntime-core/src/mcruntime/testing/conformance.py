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
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import pytest

import mcruntime as mcr
from mcruntime.provider import SourceStatus

from ._case import (
    _alpha_and_beta,
    _Case,
    _expect_engagements,
    _expect_same,
    _require,
    _require_fleet,
    _supports,
    _token_user,
    assert_indexed,
)
from ._causes import QUIET_WINDOW, watch_quietly
from ._checks import (
    CONTENT,
    CONTRACT,
    DISENGAGE,
    GONE,
    ISOLATED,
    NAMES,
    describe,
    expect,
    same_secret,
)
from ._errors import MissingExtraError

try:
    import pytest_asyncio
except ImportError as _missing:  # the suite's cases are async tests
    raise MissingExtraError("pytest-asyncio", "to run the provider conformance suite") from _missing

from ._driver import Breakage, Capability, ProviderDriver, Target
from ._fleet import Fleet
from ._harness import CONFIGMAP, EngagementRecorder, Seeder, Seen, seed_index
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

    @pytest.fixture(autouse=True)
    def _conformance_fleet(self, fleet: Fleet) -> None:
        """Fail each case before it starts, naming the option, when the fleet has too few clusters."""
        _require_fleet(fleet)

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
        await driver.add("alpha", case.target(first))
        async with case.running():
            alpha = await case.engaged("alpha")
            _expect_same(await case.get(case.name("alpha")), alpha, "provider.get")
            _expect_same(await case.get_cluster(case.name("alpha")), alpha, "manager.get_cluster")
            await case.reconciled("alpha", first, "marker")
            await case.phase("alpha", mcr.ClusterPhase.READY)
            if not (
                _supports(driver, Capability.RUNTIME_CHANGES)
                and _supports(driver, Capability.MULTIPLE_CLUSTERS)
            ):
                return
            with pytest.raises(mcr.ClusterNotFound):
                await case.get(case.name("beta"))
            await driver.add("beta", case.target(second))
            beta = await case.engaged("beta")
            _expect_same(await case.get(case.name("beta")), beta, "provider.get")
            await case.reconciled("beta", second, "marker")
            names = case.engaged_names()
            expect(names == {case.name("alpha"), case.name("beta")}, CONTRACT, f"engaged: {sorted(names)}")

    async def test_an_unknown_name_raises_cluster_not_found(self, case: _Case, fleet: Fleet) -> None:
        """``get`` of a name the source never held raises ``ClusterNotFound`` naming it."""
        await case.driver.add("alpha", case.target(fleet["cluster-1"]))
        async with case.running() as (_provider, manager):
            await case.engaged("alpha")
            for unknown in (case.name("no-such-cluster"), "no-such-cluster", "no/such/cluster", ""):
                if unknown in manager.clusters():
                    continue  # the local cluster's "" is not a provider name
                with pytest.raises(mcr.ClusterNotFound) as raised:
                    await case.get(unknown)
                expect(
                    raised.value.cluster == unknown,
                    CONTRACT,
                    f"ClusterNotFound for {unknown!r} names {raised.value.cluster!r}",
                )
                with pytest.raises(mcr.ClusterNotFound):
                    await case.get_cluster(unknown)

    async def test_names_are_stable_across_providers_over_the_same_source(
        self, case: _Case, fleet: Fleet
    ) -> None:
        """Two providers over one source engage the same names, the ones the driver documents."""
        driver = case.driver
        names = ["alpha", "beta"] if _supports(driver, Capability.MULTIPLE_CLUSTERS) else ["alpha"]
        for source_name, plane in zip(names, fleet, strict=False):
            await driver.add(source_name, case.target(plane))
        expected = {case.name(source_name) for source_name in names}
        rounds: list[set[str]] = []
        for _round in range(2):
            async with case.running():
                for source_name in names:
                    await case.engaged(source_name)
                await driver.settle()
                rounds.append(case.engaged_names())
        expect(
            rounds == [expected, expected],
            NAMES,
            f"two providers over one source engaged {[sorted(r) for r in rounds]}, "
            f"expected {sorted(expected)}",
        )

    async def test_duplicate_names_are_reported_and_never_shadow(self, case: _Case, fleet: Fleet) -> None:
        """A second source entry claiming a taken name is reported; the engaged cluster stays."""
        driver = case.driver
        _require(driver, Capability.DUPLICATE_NAMES, Capability.RUNTIME_CHANGES)
        first, second = fleet["cluster-1"], fleet["cluster-2"]
        await case.seeder.configmap(first, "marker")
        await driver.add("alpha", case.target(first))
        async with case.running():
            original = await case.serving("alpha", first, NAMES)
            await driver.add_duplicate("alpha", case.target(second))
            await driver.settle()
            await case.eventually(
                lambda: driver.duplicate_reported("alpha"),
                NAMES,
                f"a second claim on {case.name('alpha')!r} reported (driver.duplicate_reported('alpha'))",
                seen=lambda: f"it is not reported; {case.whereabouts('alpha')}",
            )
            now = await case.engaged("alpha", NAMES)
            expect(
                now is original,
                NAMES,
                f"the duplicate shadowed the name: {describe(now)} replaced {describe(original)}",
            )
            expect(
                original.config.server == first.server and not original.stopped,
                NAMES,
                f"the first claim's cluster is {describe(original)} at {original.config.server}",
            )
            count = case.recorder.count(case.name("alpha"))
            expect(count == 1, NAMES, f"the name was engaged {count} times")
            await case.reconciled("alpha", first, "marker")

    # --- change detection ----------------------------------------------------------------

    async def test_a_changed_connection_re_engages_exactly_once(self, case: _Case, fleet: Fleet) -> None:
        """Pointing a cluster at another API server engages a new cluster object, once."""
        driver = case.driver
        _require(driver, Capability.RUNTIME_CHANGES, Capability.OWN_CONNECTION)
        first, second = fleet["cluster-1"], fleet["cluster-2"]
        await case.seeder.configmap(first, "marker")
        await case.seeder.configmap(second, "marker")
        await driver.add("alpha", case.target(first))
        async with case.running():
            old = await case.serving("alpha", first)
            await case.reconciled("alpha", first, "marker")
            await driver.change("alpha", case.target(second))
            new = await case.serving("alpha", second)
            await case.reconciled("alpha", second, "marker")
            await driver.settle()
            expect(new is not old, CONTENT, f"a new connection kept the old cluster object {describe(old)}")
            expect(
                old.stopped and len(old.tasks) == 0 and old.transport.closed,
                DISENGAGE,
                f"the replaced cluster is {describe(old)} with {len(old.tasks)} tasks, "
                f"transport {'closed' if old.transport.closed else 'open'}",
            )
            _expect_engagements(case, "alpha", 2, "one change")

    async def test_an_unchanged_source_never_re_engages(self, case: _Case, fleet: Fleet) -> None:
        """Re-stating the same content, and health probes and polls going by, keep the same cluster object.

        Watched for a few seconds and at least five of the provider's own
        passes (``settle`` waits for one), a probe interval apart, so a
        provider that re-engages every few polls is seen doing it.
        """
        driver = case.driver
        plane = fleet["cluster-1"]
        await driver.add("alpha", case.target(plane))
        async with case.running():
            cluster = await case.engaged("alpha")
            await case.phase("alpha", mcr.ClusterPhase.READY)  # at least one probe went by
            if _supports(driver, Capability.RUNTIME_CHANGES):
                for _touch in range(2):
                    await driver.touch("alpha", case.target(plane))
                    await driver.settle()
            await watch_quietly(driver, PROBE_INTERVAL)
            now = await case.engaged("alpha")
            expect(
                now is cluster and not cluster.stopped,
                CONTENT,
                f"after touches and {QUIET_WINDOW:g}s of the provider's passes, {describe(now)} "
                f"replaced {describe(cluster)}",
            )
            _expect_engagements(case, "alpha", 1, "an unchanged source")

    async def test_a_credential_change_is_used_from_then_on(self, case: _Case, fleet: Fleet) -> None:
        """A new token for the same API server is used, in place or by one re-engagement."""
        driver = case.driver
        _require(driver, Capability.RUNTIME_CHANGES, Capability.CREDENTIAL_CHANGE)
        plane = fleet["cluster-3"]
        before, after = _token_user(plane, case, "before"), _token_user(plane, case, "after")
        assert after.token is not None
        await case.seeder.configmap(plane, "marker")
        await driver.add("alpha", case.target(plane, before))
        async with case.running():
            await case.engaged("alpha")
            await case.reconciled("alpha", plane, "marker")
            await driver.change_credential("alpha", case.target(plane, after))

            async def uses_new_credential() -> bool:
                cluster = await case.engaged("alpha")
                return same_secret(await cluster.transport.authorization(), f"Bearer {after.token}")

            await case.eventually(
                uses_new_credential,
                CONTENT,
                f"the new credential of {case.name('alpha')!r} in use",
                seen=lambda: f"its cluster still sends another one; {case.whereabouts('alpha')}",
            )
            await driver.settle()
            count = case.recorder.count(case.name("alpha"))
            expect(count <= 2, CONTENT, f"a credential change engaged the name {count} times (at most 2)")
            await case.seeder.configmap(plane, "after-rotation")
            await case.reconciled("alpha", plane, "after-rotation")
            await case.phase("alpha", mcr.ClusterPhase.READY)

    # --- removal -------------------------------------------------------------------------

    async def test_removal_disengages_and_releases_everything(self, case: _Case, fleet: Fleet) -> None:
        """A cluster gone from the source is stopped, forgotten and reconciled no more."""
        driver = case.driver
        _require(driver, Capability.RUNTIME_CHANGES)
        first, second = fleet["cluster-1"], fleet["cluster-2"]
        others = await _alpha_and_beta(case, first, second)
        async with case.running() as (_provider, manager):
            removed = await case.engaged("alpha")
            await case.reconciled("alpha", first, "marker")
            if others:
                await case.reconciled("beta", second, "marker")
            await driver.remove("alpha")
            name = case.name("alpha")
            await case.eventually(
                lambda: name not in manager.clusters(),
                DISENGAGE,
                f"{name!r} disengaged after its source removed it",
                seen=lambda: case.whereabouts("alpha"),
            )
            await driver.settle()
            expect(
                removed.stopped and len(removed.tasks) == 0,
                DISENGAGE,
                f"the removed cluster is {describe(removed)} with {len(removed.tasks)} tasks",
            )
            if _supports(driver, Capability.OWN_CONNECTION):  # else it shares a connection it may not close
                expect(removed.transport.closed, DISENGAGE, "the removed cluster's connections are open")
            status = driver.status("alpha")
            expect(status is None, DISENGAGE, f"a removed cluster still has a status: {case.show(status)}")
            with pytest.raises(mcr.ClusterNotFound):
                await case.get(name)
            with pytest.raises(mcr.ClusterNotFound):
                await case.get_cluster(name)
            if others:
                calls = case.seen.calls[name]
                await case.seeder.configmap(first, "after-removal")
                await case.seeder.configmap(second, "after-removal")
                await case.reconciled("beta", second, "after-removal", ISOLATED)  # the others go on
                expect(
                    case.seen.calls[name] == calls,
                    DISENGAGE,
                    f"{name!r} was reconciled after its removal",
                )
                expect(
                    (name, case.namespace, "after-removal") not in case.seen.objects,
                    DISENGAGE,
                    f"{name!r} read an object written after its removal",
                )
                names = case.engaged_names()
                expect(names == {case.name("beta")}, DISENGAGE, f"engaged after the removal: {sorted(names)}")

    # --- rule 1: only the source says gone -----------------------------------------------

    async def test_an_unparseable_source_keeps_its_cluster_and_reports_why(
        self, case: _Case, fleet: Fleet
    ) -> None:
        """A source that stops parsing means "not usable now": the cluster stays, on its last good config.

        Repairing it to the content it had before changes nothing (rule 3).
        """
        driver = case.driver
        _require(driver, Capability.RUNTIME_CHANGES, Capability.UNPARSEABLE_SOURCE)
        plane = fleet["cluster-1"]
        await case.seeder.configmap(plane, "marker")
        await driver.add("alpha", case.target(plane))
        async with case.running() as (provider, manager):
            cluster = await case.engaged("alpha")
            await case.reconciled("alpha", plane, "marker")
            await driver.corrupt("alpha")
            await driver.settle()
            case.assert_credentials_hidden("after its source stopped parsing")
            name = case.name("alpha")
            now = manager.clusters().get(name)
            expect(
                now is cluster and not cluster.stopped,
                GONE,
                f"after its source stopped parsing, {name!r} is {describe(now)}; it was {describe(cluster)}",
            )
            got = await case.get(name)
            expect(got is cluster, GONE, f"provider.get({name!r}) returned {describe(got)}")
            status = driver.status("alpha")
            expect(
                status is not None and status.phase is not mcr.ClusterPhase.FAILED,
                GONE,
                f"a cluster running on its last good config is reported {case.show(status)}",
            )
            assert status is not None
            if status.source is not None:  # a provider that reports sources says what is wrong
                sources = getattr(provider, "sources", None)
                reported: list[SourceStatus] = list(sources().values()) if callable(sources) else []
                errors = [source.error for source in (status.source, *reported) if source.error]
                expect(
                    errors,
                    GONE,
                    f"no source says why it does not parse; its cluster's is {case.show(status.source)}",
                )
            await case.seeder.configmap(plane, "while-unparseable")
            await case.reconciled("alpha", plane, "while-unparseable", GONE)
            await driver.add("alpha", case.target(plane))  # repaired: the same content as before
            await driver.settle()
            count = case.recorder.count(name)
            expect(
                count == 1,
                CONTENT,
                f"repairing the source to its old content engaged {name!r} {count} times",
            )

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
        broken = case.target(broken_plane, breakage=breakage)
        if others:
            await case.seeder.configmap(healthy, "marker")
            await driver.add("alpha", case.target(healthy))
        await driver.add(broken_name, broken)
        async with case.running() as (_provider, manager):
            status = await case.phase(broken_name, mcr.ClusterPhase.UNHEALTHY, GONE)
            expect(status.error, ISOLATED, f"an unhealthy cluster must say why: {case.show(status)}")
            cluster = await case.engaged(broken_name, GONE)  # unavailable is not gone
            got = await case.get(case.name(broken_name))
            expect(got is cluster, GONE, f"provider.get of the broken cluster returned {describe(got)}")
            case.assert_credentials_hidden(f"while the cluster is broken ({breakage.value})")
            if others:
                await case.reconciled("alpha", healthy, "marker", ISOLATED)
                await case.seeder.configmap(healthy, "while-broken")
                await case.reconciled("alpha", healthy, "while-broken", ISOLATED)
                await case.phase("alpha", mcr.ClusterPhase.READY, ISOLATED)
            still = driver.status(broken_name)
            expect(
                still is not None and still.phase is mcr.ClusterPhase.UNHEALTHY,
                GONE,
                f"a broken cluster must stay reported unhealthy; its status is {case.show(still)}",
            )
            expect(case.name(broken_name) in manager.clusters(), GONE, "the broken cluster was disengaged")

    async def test_a_cluster_broken_while_running_stays_and_recovers(self, case: _Case, fleet: Fleet) -> None:
        """Breaking a running cluster makes it unhealthy, not gone; fixing it makes it ready."""
        driver = case.driver
        _require(driver, Capability.RUNTIME_CHANGES, Capability.OWN_CONNECTION)
        first, second = fleet["cluster-1"], fleet["cluster-2"]
        others = await _alpha_and_beta(case, first, second)
        async with case.running() as (_provider, _manager):
            await case.reconciled("alpha", first, "marker")
            await driver.break_cluster("alpha", case.target(first, breakage=Breakage.UNREACHABLE))
            await case.phase("alpha", mcr.ClusterPhase.UNHEALTHY, GONE)
            await case.engaged("alpha", GONE)
            await case.get(case.name("alpha"))
            case.assert_credentials_hidden("while the cluster is broken")
            if others:
                await case.seeder.configmap(second, "while-broken")
                await case.reconciled("beta", second, "while-broken", ISOLATED)
            await driver.change("alpha", case.target(first))
            await case.serving("alpha", first)
            await case.phase("alpha", mcr.ClusterPhase.READY, GONE)
            await case.seeder.configmap(first, "after-repair")
            await case.reconciled("alpha", first, "after-repair")

    # --- indexes -------------------------------------------------------------------------

    async def test_field_indexes_apply_whenever_they_are_registered(self, case: _Case, fleet: Fleet) -> None:
        """An index registered before a cluster is engaged, and one after, both apply to it."""
        driver = case.driver
        first, second = fleet["cluster-1"], fleet["cluster-2"]
        await case.seeder.configmap(first, "indexed")
        await driver.add("alpha", case.target(first))
        provider, _manager = case.build()
        await case.call(
            provider.index_field(CONFIGMAP, "conformance-early", seed_index),
            "provider.index_field(ConfigMap, 'conformance-early')",
        )
        async with case.run():
            alpha = await case.engaged("alpha")
            await case.call(
                provider.index_field(CONFIGMAP, "conformance-late", seed_index),
                "provider.index_field(ConfigMap, 'conformance-late')",
            )
            await assert_indexed(alpha, case.seeder.token, ["indexed"])
            if not (
                _supports(driver, Capability.RUNTIME_CHANGES)
                and _supports(driver, Capability.MULTIPLE_CLUSTERS)
            ):
                return
            await case.seeder.configmap(second, "indexed")
            await driver.add("beta", case.target(second))
            await assert_indexed(await case.engaged("beta"), case.seeder.token, ["indexed"])

    # --- churn ---------------------------------------------------------------------------

    async def test_the_engaged_set_converges_after_churn(self, case: _Case, fleet: Fleet) -> None:
        """After a burst of adds, changes and removals, what is engaged is what the source says."""
        driver = case.driver
        _require(driver, Capability.RUNTIME_CHANGES, Capability.MULTIPLE_CLUSTERS)
        p1, p2, p3 = fleet["cluster-1"], fleet["cluster-2"], fleet["cluster-3"]
        for plane in (p1, p2, p3):
            await case.seeder.configmap(plane, "marker")
        await driver.add("alpha", case.target(p1))
        await driver.add("beta", case.target(p2))
        async with case.running() as (_provider, manager):
            await case.engaged("alpha")
            await case.engaged("beta")

            async def alpha() -> None:
                await driver.change("alpha", case.target(p2))
                await driver.change("alpha", case.target(p3))

            async def beta() -> None:
                await driver.remove("beta")
                await driver.add("beta", case.target(p3))

            async def gamma() -> None:
                await driver.add("gamma", case.target(p3))
                await driver.remove("gamma")
                await driver.add("gamma", case.target(p1))

            async def delta() -> None:
                await driver.add("delta", case.target(p2))

            async def epsilon() -> None:
                await driver.add("epsilon", case.target(p1))
                await driver.change("epsilon", case.target(p3))
                await driver.remove("epsilon")

            await asyncio.gather(alpha(), beta(), gamma(), delta(), epsilon())
            await driver.settle()
            expected = {"alpha": p3, "beta": p3, "gamma": p1, "delta": p2}
            await case.eventually(
                lambda: case.engaged_names() == {case.name(n) for n in expected},
                CONTENT,
                f"the engaged set to become {sorted(case.name(n) for n in expected)} after churn",
                seen=lambda: f"it is {sorted(case.engaged_names())}",
            )
            for source_name, plane in expected.items():
                await case.serving(source_name, plane)
                await case.reconciled(source_name, plane, "marker")
                await case.phase(source_name, mcr.ClusterPhase.READY)
            with pytest.raises(mcr.ClusterNotFound):
                await case.get(case.name("epsilon"))
            status = driver.status("epsilon")
            expect(status is None, DISENGAGE, f"removed in the churn, it has a status: {case.show(status)}")
            current = set(map(id, manager.clusters().values()))

            def running_still() -> list[str]:
                gone = [c for _n, c in case.recorder.every_cluster() if id(c) not in current]
                return [describe(c) for c in gone if not c.stopped]

            await case.eventually(
                lambda: not running_still(),
                DISENGAGE,
                "every replaced or removed cluster stopped",
                seen=lambda: f"still running: {running_still()}",
            )
