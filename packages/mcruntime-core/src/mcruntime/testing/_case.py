"""The running world of one conformance case: the driver, the provider, the manager, the observers.

Its waits fail as broken rules (:func:`~._checks.eventually`), saying what was
there instead, and it holds the case's :class:`~._leaks.LeakWatch`: every
target a case hands the driver is made here (:meth:`_Case.target`), so rule 7
can be checked against exactly the credentials the driver wrote. Its driver
is the provider's own behind a :class:`~._causes.WatchedDriver`, so every
block the provider runs in ends with rule 3 checked over all of it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import TypeVar

import pytest

import mcruntime as mcr

from ._causes import WatchedDriver, uncaused_engagements, unwrapped
from ._checks import CONTENT, CONTRACT, CREDENTIALS, GUIDE, RuleBroken, describe, eventually, expect
from ._controlplane import ControlPlane, User
from ._driver import Breakage, Capability, ProviderDriver, Target
from ._ending import ManagerWatch
from ._fleet import Fleet
from ._harness import CONFIGMAP, EngagementRecorder, Seeder, Seen, running
from ._leaks import LeakWatch, shown

T = TypeVar("T")

FLEET = ("cluster-1", "cluster-2", "cluster-3")
"""The session fleet's clusters the cases use: ``--testbed-clusters=3``, the plugin's default."""


def _require_fleet(fleet: Fleet) -> None:
    """Fail every case up front when the fleet is too small, not with a KeyError halfway through one."""
    missing = [name for name in FLEET if name not in fleet.names]
    if missing:
        pytest.fail(
            f"too few testbed clusters: run pytest with --testbed-clusters={len(FLEET)} (the default) "
            f"or more; the provider conformance suite uses {', '.join(FLEET)}, and this session's "
            f"fleet has {sorted(fleet.names)}",
            pytrace=False,
        )


def _require(driver: ProviderDriver, *capabilities: Capability) -> None:
    driver = unwrapped(driver)
    for capability in capabilities:
        reason = driver.unsupported.get(capability)
        if reason is not None:
            pytest.skip(f"{type(driver).__name__}: no {capability.name}: {reason}")


def _supports(driver: ProviderDriver, capability: Capability) -> bool:
    return capability not in unwrapped(driver).unsupported


@dataclass
class _Case:
    """One case's running world: the driver, the provider, the manager and the observers."""

    driver: ProviderDriver
    seeder: Seeder
    recorder: EngagementRecorder
    seen: Seen
    provider: mcr.Provider | None = None
    manager: mcr.Manager | None = None
    leaks: LeakWatch = field(default_factory=LeakWatch)
    timeout: float = 30.0
    """Seconds any one wait of the case may take before it fails as a broken rule."""
    source: WatchedDriver = field(init=False)
    """``driver`` as the cases use it: the provider's own, with the source changes timed (rule 3)."""
    watch: ManagerWatch | None = field(default=None, init=False)
    """While the provider runs (:meth:`run`): its task and the manager's, which every wait races."""

    def __post_init__(self) -> None:
        # Every source change a case makes passes here, so rule 3 holds over the whole case.
        self.source = self.driver if isinstance(self.driver, WatchedDriver) else WatchedDriver(self.driver)
        self.driver = self.source

    @property
    def namespace(self) -> str:
        return self.seeder.namespace

    def name(self, source_name: str) -> str:
        return self.driver.engaged_name(source_name)

    def target(
        self, plane: ControlPlane, user: User | None = None, breakage: Breakage | None = None
    ) -> Target:
        """:meth:`Target.of`, with its credential watched from now on (rule 7)."""
        target = Target.of(plane, user, breakage)
        self.leaks.add_target(target)
        return target

    async def eventually(
        self,
        condition: Callable[[], object | Awaitable[object]],
        rule: str,
        what: str,
        *,
        seen: Callable[[], str] | None = None,
    ) -> None:
        """:func:`~._checks.eventually` within the case's timeout; at once a failure if the provider fails.

        A provider whose ``run()`` raised will never make ``condition`` true:
        waiting out the timeout would only report the rule waited for.
        """
        wait = eventually(condition, rule, what, seen=seen, timeout=self.timeout)
        if self.watch is None:
            await wait
        else:
            await self.watch.guard(wait, what)

    async def call(self, awaitable: Awaitable[T], what: str, rule: str = CONTRACT) -> T:
        """Await one of the provider's or the manager's own calls, as ``provider.get``, within the timeout.

        Outside :meth:`eventually`, a ``get`` that never returns hung the case
        with no message at all, and one left waiting after the provider's
        ``run()`` failed waited for nothing: each fails here, naming the call.
        What the call raises (``ClusterNotFound``) is raised unchanged.
        """
        deadline = asyncio.timeout(self.timeout)
        try:
            async with deadline:
                if self.watch is None:
                    return await awaitable
                return await self.watch.guard(awaitable, what)
        except TimeoutError:
            if not deadline.expired():
                raise  # the call's own error, not the case's deadline
            raise RuleBroken(
                f"{rule} (see {GUIDE}): {what} did not return within {self.timeout:g}s"
            ) from None

    async def get(self, name: str) -> mcr.Cluster:
        """``provider.get(name)`` of the running provider, through :meth:`call`."""
        assert self.provider is not None, "get() before build()"
        return await self.call(self.provider.get(name), f"provider.get({name!r})")

    async def get_cluster(self, name: str) -> mcr.Cluster:
        """``manager.get_cluster(name)`` of the running manager, through :meth:`call`."""
        assert self.manager is not None, "get_cluster() before build()"
        return await self.call(self.manager.get_cluster(name), f"manager.get_cluster({name!r})")

    def show(self, value: object) -> str:
        """``value`` for a failure message, with any credential it quotes hidden."""
        return self.leaks.redact(str(value))

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
        async with self.run():
            yield provider, manager

    @asynccontextmanager
    async def run(self) -> AsyncIterator[None]:
        """Run the built manager for the block; rule 7 over all it showed and logged, when the block ends.

        Checked at the end of every block, so a provider that quotes a
        credential anywhere fails whichever case it runs in. The manager and
        its provider are watched meanwhile: if the provider's ``run()``
        raises, the case's waits (and the driver's calls) stop at once and
        the case fails with :class:`~._ending.ProviderFailed`, leading with
        that error.
        """
        assert self.manager is not None, "build() first"
        since, held = time.monotonic(), set(self.source.held)
        watch = ManagerWatch(self.leaks.redact)
        self.watch = self.source.watch = watch
        try:
            with self.leaks.watching():
                async with running(self.manager, self.recorder, watch):
                    yield
                    self.assert_credentials_hidden("while the provider ran")
                    self.assert_engagements_caused(since, held)
        finally:
            self.watch = self.source.watch = None
        self.assert_credentials_hidden("while the provider stopped", logs_only=True)

    def assert_engagements_caused(self, since: float, held: set[str]) -> None:
        """Rule 3 over the block: no name engaged more often than its source changed (see ``_causes``)."""
        uncaused = uncaused_engagements(self.source, self.recorder, since, held)
        expect(not uncaused, CONTENT, "; ".join(uncaused))

    def assert_credentials_hidden(self, when: str, *, logs_only: bool = False) -> None:
        """Rule 7: no credential a target gave the driver in a status, a source, a repr or a log record."""
        if not logs_only:
            for where, text in self._shown():
                whose = self.leaks.found_in(text)
                expect(
                    whose is None,
                    CREDENTIALS,
                    f"{whose} appears in {self.leaks.redact(where)} {when}; "
                    "say where a source is broken, never what it contains",
                )
        logged = self.leaks.logged
        expect(not logged, CREDENTIALS, f"{'; '.join(logged)}, logged {when}")

    def _shown(self) -> Iterator[tuple[str, str]]:
        """Everything the provider and the clusters it engaged show: ``(where, text)``."""
        if self.provider is not None:
            yield "repr(provider)", repr(self.provider)
            for name, status in self.provider.statuses().items():
                yield from shown(f"provider.statuses()[{name!r}]", status)
            sources = getattr(self.provider, "sources", None)
            if callable(sources):
                for key, source in dict(sources()).items():
                    yield from shown(f"provider.sources()[{key!r}]", source)
        if self.manager is not None:
            for name, cluster in self.manager.clusters().items():
                yield f"the repr of cluster {name!r}", repr(cluster)
                yield f"the repr of cluster {name!r}'s config", repr(cluster.config)

    def engaged_names(self) -> set[str]:
        assert self.manager is not None
        return {name for name in self.manager.clusters() if name != mcr.LOCAL_CLUSTER}

    def whereabouts(self, source_name: str) -> str:
        """Where a cluster is, for a failure: never engaged, engaged (how often), or gone again."""
        assert self.manager is not None
        name = self.name(source_name)
        count = self.recorder.count(name)
        cluster = self.manager.clusters().get(name)
        if count == 0:
            where = f"{name!r} was never engaged (engaged: {sorted(self.engaged_names())})"
        elif cluster is None:
            where = f"{name!r} was engaged {count} times and is not engaged now"
        else:
            where = f"{name!r} is engaged as {describe(cluster)}"
        return f"{where}; its status is {self.show(self.driver.status(source_name))}"

    async def engaged(self, source_name: str, rule: str = CONTRACT) -> mcr.Cluster:
        """Wait until ``source_name`` is engaged with the manager; return its cluster."""
        assert self.manager is not None
        manager, name = self.manager, self.name(source_name)
        await self.eventually(
            lambda: name in manager.clusters(),
            rule,
            f"cluster {name!r} engaged",
            seen=lambda: self.whereabouts(source_name),
        )
        return manager.clusters()[name]

    async def reconciled(
        self, source_name: str, plane: ControlPlane, configmap: str, rule: str = CONTRACT
    ) -> None:
        """Wait until the reconciler read ``configmap`` from ``plane`` under the cluster's name."""
        key = (self.name(source_name), self.namespace, configmap)

        def instead() -> str:
            read = f"read it from {self.seen.objects[key]}" if key in self.seen.objects else "never read it"
            return f"the reconciler {read}; {self.whereabouts(source_name)}"

        await self.eventually(
            lambda: self.seen.objects.get(key) == plane.name,
            rule,
            f"ConfigMap {configmap!r} of {plane.name} reconciled as cluster {key[0]!r}",
            seen=instead,
        )

    async def phase(
        self, source_name: str, state: mcr.ClusterPhase, rule: str = CONTRACT
    ) -> mcr.ClusterStatus:
        """Wait until the provider reports ``source_name`` in ``state``; return the status."""
        driver = self.driver

        def reached() -> bool:
            status = driver.status(source_name)
            return status is not None and status.phase is state

        await self.eventually(
            reached,
            rule,
            f"cluster {source_name!r} reported {state.value}",
            seen=lambda: self.whereabouts(source_name),
        )
        status = driver.status(source_name)
        assert status is not None
        return status

    async def serving(self, source_name: str, plane: ControlPlane, rule: str = CONTENT) -> mcr.Cluster:
        """Wait until ``source_name`` is engaged with a cluster whose server is ``plane``'s."""
        assert self.manager is not None
        manager, name = self.manager, self.name(source_name)

        def pointed() -> bool:
            cluster = manager.clusters().get(name)
            return cluster is not None and cluster.config.server == plane.server

        await self.eventually(
            pointed,
            rule,
            f"cluster {name!r} engaged with {plane.name} ({plane.server})",
            seen=lambda: self.whereabouts(source_name),
        )
        return manager.clusters()[name]


def _token_user(plane: ControlPlane, case: _Case, role: str) -> User:
    return plane.add_token_user(f"conformance-{case.seeder.token}-{role}")


def _expect_engagements(case: _Case, source_name: str, times: int, what: str) -> None:
    """The name was engaged ``times`` times in all, as the recorder saw it and as the status counts it."""
    count = case.recorder.count(case.name(source_name))
    expect(count == times, CONTENT, f"{what} engaged the name {count} times (expected {times} in all)")
    status = case.driver.status(source_name)
    counted = status.engagements if status is not None else None
    expect(counted == times, CONTENT, f"the status counts {counted} engagements, expected {times}")


async def _alpha_and_beta(case: _Case, first: ControlPlane, second: ControlPlane) -> bool:
    """Sources "alpha" on ``first`` and, if the provider holds several, "beta" on ``second``; whether it does.

    Each plane gets a ``marker`` ConfigMap to reconcile.
    """
    others = _supports(case.driver, Capability.MULTIPLE_CLUSTERS)
    for source_name, plane in [("alpha", first), ("beta", second)][: 2 if others else 1]:
        await case.seeder.configmap(plane, "marker")
        await case.driver.add(source_name, case.target(plane))
    return others


def _expect_same(got: mcr.Cluster, engaged: mcr.Cluster, call: str) -> None:
    """``call`` answered with the very cluster object the manager has engaged under that name."""
    expect(got is engaged, CONTRACT, f"{call} returned {describe(got)}, the manager has {describe(engaged)}")


async def assert_indexed(cluster: mcr.Cluster, token: str, names: Sequence[str]) -> None:
    """Both of the index case's indexes find exactly ``names`` in ``cluster``."""
    for index in ("conformance-early", "conformance-late"):
        listed = await cluster.cache.list(CONFIGMAP, index=(index, token))
        found = sorted(obj["metadata"]["name"] for obj in listed)
        expect(
            found == sorted(names),
            CONTRACT,
            f"index {index!r} in cluster {cluster.name!r} finds {found}, expected {sorted(names)}",
        )
