"""The conformance suite fails a provider that breaks rule 1 or rule 3, and says so by the rule's name.

A provider written from the guide that empties its fleet when its source stops
parsing passed every case before the suite could make a source unparseable.
Here is such a provider, and the rule-1 case run against it must fail naming
"rule 1, only the source says gone" and what it saw.

A provider that tears down and re-engages its clusters every few polls passed
every case too: each case looked for a re-engagement at one moment, or over
fewer polls than the provider waited, and a remove followed by an add starts
the status's engagement count at 1 again. Here is such a provider (its passes
driven by the driver, so when it refreshes is certain), and the suite must
fail it naming "rule 3, re-engage on content, never on events".

A provider whose ``run()`` raised was reported, after each wait's 30 s, as
the rule the case was waiting for, or as the driver's own timeout; and one
whose ``run()`` returned without stopping its clusters failed with a bare
"tasks left running". Here a provider crashes on a request of the driver, and
the case must fail at once with its error chained; and one leaves its
``ClusterSet`` running, and the suite must fail it naming rule 5 and the cluster.
"""

from __future__ import annotations

import asyncio
import time
from typing import cast

import pytest
import yaml

import mcruntime as mcr
from mcruntime.provider import ClusterSetProvider
from mcruntime.testing import Fleet
from mcruntime.testing._case import _Case
from mcruntime.testing._causes import QUIET_PASSES, QUIET_WINDOW, WatchedDriver, uncaused_engagements
from mcruntime.testing._checks import RuleBroken
from mcruntime.testing._harness import EngagementRecorder, Seeder, Seen
from mcruntime.testing.conformance import (
    CLUSTER_OPTIONS,
    PROBE_INTERVAL,
    ProviderConformance,
    ProviderDriver,
    Target,
)


class ForgetfulProvider(ClusterSetProvider):
    """Kubeconfig texts by name; one that stops parsing is dropped (the bug rule 1 forbids)."""

    def __init__(self, texts: dict[str, str]) -> None:
        super().__init__("forgetful provider", options=CLUSTER_OPTIONS, probe_interval=PROBE_INTERVAL)
        self.texts = texts

    async def run(self, aware: mcr.Aware) -> None:
        await self.apply()
        await self.clusters.run(aware)

    async def apply(self) -> None:
        configs = {}
        for name, text in self.texts.items():
            try:
                configs[name] = mcr.kubeconfig_from_yaml(text, origin=name)
            except mcr.KubeconfigError:
                continue  # the bug: "cannot parse" taken for "gone"
        await self.clusters.sync(configs)


class ForgetfulDriver(ProviderDriver):
    def __init__(self) -> None:
        self.texts: dict[str, str] = {}
        self.provider: ForgetfulProvider | None = None

    def build(self) -> mcr.Provider:
        self.provider = ForgetfulProvider(self.texts)
        return self.provider

    def status(self, name: str) -> mcr.ClusterStatus | None:
        return self.provider.statuses().get(name) if self.provider is not None else None

    async def _put(self, name: str, text: str | None) -> None:
        if text is None:
            self.texts.pop(name, None)
        else:
            self.texts[name] = text
        if self.provider is not None:
            await self.provider.apply()

    async def add(self, name: str, target: Target) -> None:
        await self._put(name, yaml.safe_dump(target.kubeconfig()))

    async def corrupt(self, name: str) -> None:
        await self._put(name, "clusters: [unclosed\n")

    async def remove(self, name: str) -> None:
        await self._put(name, None)


async def test_the_rule_1_case_fails_a_provider_that_forgets_a_cluster_whose_source_stops_parsing(
    fleet: Fleet,
) -> None:
    driver = ForgetfulDriver()
    seeder = Seeder()
    driver.use_namespace(seeder.namespace)
    case = _Case(driver, seeder, EngagementRecorder(), Seen())
    try:
        with pytest.raises(RuleBroken) as raised:
            await ProviderConformance().test_an_unparseable_source_keeps_its_cluster_and_reports_why(
                case, fleet
            )
    finally:
        await seeder.close()
    message = str(raised.value)
    assert message.startswith("rule 1, only the source says gone (see docs/guides/writing-a-provider.md): ")
    assert "after its source stopped parsing, 'alpha' is not engaged" in message, message
    assert "stopped" in message  # what became of the cluster it had


# --- rule 3: re-engage on content, never on events -------------------------------------------


class RefreshingProvider(ClusterSetProvider):
    """Configs by name, applied one pass at a time; every ``every``-th pass "refreshes" (the bug).

    The refresh removes every cluster and syncs the same configs again: each
    cluster is stopped and a new one engaged, though nothing in its source
    changed. With ``every=2`` the first change while it runs (an event about
    another cluster, say) refreshes every cluster already there.
    """

    def __init__(self, configs: dict[str, mcr.ClusterConfig], every: int) -> None:
        super().__init__("refreshing provider", options=CLUSTER_OPTIONS, probe_interval=PROBE_INTERVAL)
        self.configs, self.every = configs, every
        self.passes = 0

    async def run(self, aware: mcr.Aware) -> None:
        await self.apply()
        await self.clusters.run(aware)

    async def apply(self) -> None:
        self.passes += 1
        if self.passes % self.every == 0:
            for name in self.clusters.names():
                await self.clusters.remove(name)
        await self.clusters.sync(dict(self.configs))


class RefreshingDriver(ProviderDriver):
    """Every change of the source is one pass of the provider, and so is every ``settle``."""

    def __init__(self, every: int) -> None:
        self.every = every
        self.configs: dict[str, mcr.ClusterConfig] = {}
        self.provider: RefreshingProvider | None = None

    def build(self) -> mcr.Provider:
        self.provider = RefreshingProvider(self.configs, self.every)
        return self.provider

    def status(self, name: str) -> mcr.ClusterStatus | None:
        return self.provider.statuses().get(name) if self.provider is not None else None

    async def _pass(self) -> None:
        if self.provider is not None:
            await self.provider.apply()

    async def add(self, name: str, target: Target) -> None:
        self.configs[name] = target.config()
        await self._pass()

    async def touch(self, name: str, target: Target) -> None:
        await self._pass()

    async def remove(self, name: str) -> None:
        self.configs.pop(name, None)
        await self._pass()

    async def settle(self) -> None:
        await self._pass()


async def _run_case(fleet: Fleet, driver: ProviderDriver, case_name: str) -> None:
    seeder = Seeder()
    driver.use_namespace(seeder.namespace)
    case = _Case(driver, seeder, EngagementRecorder(), Seen())
    try:
        await getattr(ProviderConformance(), case_name)(case, fleet)
    finally:
        await seeder.close()


async def test_the_unchanged_source_case_fails_a_provider_that_refreshes_every_few_polls(
    fleet: Fleet,
) -> None:
    # Run, two touches with a settle each, one more settle: the six passes the case watched before.
    every = 2 + 2 + QUIET_PASSES
    driver = RefreshingDriver(every)
    with pytest.raises(RuleBroken) as raised:
        await _run_case(fleet, driver, "test_an_unchanged_source_never_re_engages")
    message = str(raised.value)
    assert message.startswith("rule 3, re-engage on content, never on events (see docs/guides/"), message
    seen = f"after touches and {QUIET_WINDOW:g}s of the provider's passes, <Cluster 'alpha'"
    assert seen in message, message
    assert "(object 0x" in message and "stopped)" in message, message  # which object, and it is gone
    assert driver.provider is not None and driver.provider.passes >= every


async def test_a_re_engagement_on_an_event_fails_whichever_case_it_happens_in(fleet: Fleet) -> None:
    # Adding beta refreshes alpha too; this case checks no count, the end of its block does.
    with pytest.raises(RuleBroken) as raised:
        await _run_case(
            fleet, RefreshingDriver(2), "test_engages_on_add_and_reconciles_against_the_right_cluster"
        )
    message = str(raised.value)
    assert message.startswith("rule 3, re-engage on content, never on events (see docs/guides/"), message
    assert "'alpha' was engaged 2 times while the provider ran, and engagement 2 at +" in message, message
    assert "had no change of its source to cause it" in message, message
    assert "(stopped +" in message, message  # the first one's disengagement is named
    assert "'beta'" not in message, message  # engaged once, when it was added


async def test_an_honest_refresh_free_provider_passes_both_cases(fleet: Fleet) -> None:
    for case_name in (
        "test_an_unchanged_source_never_re_engages",
        "test_engages_on_add_and_reconciles_against_the_right_cluster",
    ):
        await _run_case(fleet, RefreshingDriver(every=10**6), case_name)


# --- the causes, as pure logic -----------------------------------------------------------------


class _Source(ProviderDriver):
    """A source that is only the suite's record of it: the cause check's logic, without a provider."""

    def build(self) -> mcr.Provider:
        raise AssertionError("not built")

    def status(self, name: str) -> mcr.ClusterStatus | None:
        return None

    async def add(self, name: str, target: Target) -> None:
        return None

    async def remove(self, name: str) -> None:
        return None

    async def corrupt(self, name: str) -> None:
        return None


class _Engagements:
    """Engagements recorded as the manager would, with stand-ins read only for their identity."""

    def __init__(self) -> None:
        self.recorder = EngagementRecorder()

    def engage(self, name: str) -> None:
        self.recorder.engaged[name].append(cast("mcr.Cluster", object()))
        self.recorder.engaged_at[name].append(time.monotonic())


def _target(label: str) -> Target:
    return cast("Target", (label,))  # the check compares targets by equality only


async def test_causes_a_removal_then_an_add_of_the_same_content_is_one() -> None:
    watched, seen = WatchedDriver(_Source()), _Engagements()
    since = time.monotonic()
    await watched.add("alpha", _target("one"))
    seen.engage("alpha")
    await watched.remove("alpha")
    await watched.add("alpha", _target("one"))  # it appears again: a cause
    seen.engage("alpha")
    assert uncaused_engagements(watched, seen.recorder, since, held=()) == []


async def test_causes_a_repair_to_the_held_content_a_touch_and_a_corrupt_are_none() -> None:
    watched, seen = WatchedDriver(_Source()), _Engagements()
    await watched.add("alpha", _target("one"))
    since = time.monotonic()  # the provider starts with alpha in its source
    seen.engage("alpha")
    await watched.touch("alpha", _target("one"))
    await watched.corrupt("alpha")
    await watched.add("alpha", _target("one"))  # the content it held: a repair
    seen.engage("alpha")
    problems = uncaused_engagements(watched, seen.recorder, since, held={"alpha"})
    assert len(problems) == 1, problems
    assert problems[0].startswith("'alpha' was engaged 2 times while the provider ran, and engagement 2 at +")
    assert "its source changed since the provider started: never" in problems[0], problems


async def test_causes_fewer_engagements_than_changes_are_fine_but_none_ahead_of_them() -> None:
    watched, seen = WatchedDriver(_Source()), _Engagements()
    since = time.monotonic()
    await watched.add("alpha", _target("one"))
    seen.engage("alpha")
    await watched.change("alpha", _target("two"))  # two quick changes, seen in one pass
    await watched.change_credential("alpha", _target("three"))
    seen.engage("alpha")
    seen.engage("alpha")  # three causes so far, three engagements
    assert uncaused_engagements(watched, seen.recorder, since, held=()) == []
    seen.engage("alpha")
    problems = uncaused_engagements(watched, seen.recorder, since, held=())
    assert len(problems) == 1 and "and engagement 4 at +" in problems[0], problems


# --- a provider that fails: the case stops at once, and says why ------------------------------


class CrashingProvider(ClusterSetProvider):
    """Configs by name, applied one pass per request; the request ``crash_on`` makes ``run()`` raise.

    With ``returns``, that request makes ``run()`` return instead, as if its
    source had ended: no error, and no cancellation asked for it.
    """

    def __init__(self, configs: dict[str, mcr.ClusterConfig], crash_on: str, returns: bool = False) -> None:
        super().__init__("crashing provider", options=CLUSTER_OPTIONS, probe_interval=PROBE_INTERVAL)
        self.configs, self.crash_on, self.returns = configs, crash_on, returns
        self.requests: asyncio.Queue[str] = asyncio.Queue()
        self.asked = self.passes = 0
        self.passed = asyncio.Condition()
        self.error: RuntimeError | None = None

    async def run(self, aware: mcr.Aware) -> None:
        await self.clusters.sync(dict(self.configs))
        engaging = asyncio.create_task(self.clusters.run(aware))
        try:
            while True:
                request = await self.requests.get()
                if request == self.crash_on and self.returns:
                    return
                if request == self.crash_on:
                    self.error = RuntimeError(f"the source exploded on {request}")
                    raise self.error
                await self.clusters.sync(dict(self.configs))
                async with self.passed:
                    self.passes += 1
                    self.passed.notify_all()
        finally:
            engaging.cancel()
            await asyncio.gather(engaging, return_exceptions=True)


class CrashingDriver(ProviderDriver):
    """Each edit asks the provider for a pass; ``settle`` waits for them, as a poller's driver does."""

    def __init__(self, crash_on: str, returns: bool = False) -> None:
        self.crash_on, self.returns = crash_on, returns
        self.configs: dict[str, mcr.ClusterConfig] = {}
        self.provider: CrashingProvider | None = None

    def build(self) -> mcr.Provider:
        self.provider = CrashingProvider(self.configs, self.crash_on, self.returns)
        return self.provider

    def status(self, name: str) -> mcr.ClusterStatus | None:
        return self.provider.statuses().get(name) if self.provider is not None else None

    def _ask(self, request: str) -> None:
        if self.provider is not None:
            self.provider.asked += 1
            self.provider.requests.put_nowait(request)

    async def add(self, name: str, target: Target) -> None:
        self.configs[name] = target.config()
        self._ask("add")

    async def break_cluster(self, name: str, target: Target) -> None:
        self.configs[name] = target.config()
        self._ask("break")

    async def touch(self, name: str, target: Target) -> None:
        self._ask("touch")

    async def remove(self, name: str) -> None:
        self.configs.pop(name, None)
        self._ask("remove")

    async def settle(self) -> None:
        provider = self.provider
        if provider is None:
            return
        async with asyncio.timeout(30), provider.passed:  # a dead provider's pass never comes
            await provider.passed.wait_for(lambda: provider.passes >= provider.asked)


@pytest.mark.parametrize(
    ("crash_on", "case_name"),
    [
        ("touch", "test_an_unchanged_source_never_re_engages"),  # then the case waits in settle()
        ("break", "test_a_cluster_broken_while_running_stays_and_recovers"),  # in case.phase()
    ],
)
async def test_a_provider_whose_run_raises_fails_the_case_at_once_with_its_error(
    fleet: Fleet, crash_on: str, case_name: str
) -> None:
    driver = CrashingDriver(crash_on)
    with pytest.raises(AssertionError) as raised:
        await _run_case(fleet, driver, case_name)
    assert driver.provider is not None and driver.provider.error is not None
    failure = raised.value
    assert type(failure).__name__ == "ProviderFailed", failure  # no rule: the provider failed
    assert str(failure).startswith(
        f"the provider's run() raised RuntimeError: the source exploded on {crash_on} "
        "(the case stopped waiting at once; it was waiting for "
    ), failure
    assert failure.__cause__ is driver.provider.error  # it stopped for the crash, and chains it


@pytest.mark.parametrize(
    ("returns_on", "case_name"),
    [
        ("touch", "test_an_unchanged_source_never_re_engages"),  # then the case waits in settle()
        ("break", "test_a_cluster_broken_while_running_stays_and_recovers"),  # in case.phase()
    ],
)
async def test_a_provider_whose_run_returns_early_fails_the_case_at_once(
    fleet: Fleet, returns_on: str, case_name: str
) -> None:
    driver = CrashingDriver(returns_on, returns=True)
    with pytest.raises(AssertionError) as raised:
        await _run_case(fleet, driver, case_name)
    failure = raised.value
    assert type(failure).__name__ == "ProviderFailed", failure  # not a rule's 30 s timeout
    assert str(failure).startswith(
        "the provider's run() returned while the manager ran, before it was cancelled: it engages and "
        "disengages nothing from then on, and a provider's run() is to run until cancelled (the case "
        "stopped waiting at once; it was waiting for "
    ), failure
    assert failure.__cause__ is None  # nothing raised, so nothing is chained


class HangingGetProvider(CrashingProvider):
    """Engages as asked, but its ``get`` of an engaged name never returns (the bug)."""

    async def get(self, name: str) -> mcr.Cluster:
        await asyncio.Event().wait()
        raise AssertionError("unreachable")


class HangingGetDriver(CrashingDriver):
    def build(self) -> mcr.Provider:
        self.provider = HangingGetProvider(self.configs, crash_on="never")
        return self.provider


async def test_a_provider_whose_get_never_returns_fails_the_case_naming_the_call(fleet: Fleet) -> None:
    # The case's bound, shortened: a get outside a case's waits hung the case with no message.
    seeder = Seeder()
    driver = HangingGetDriver("never")
    driver.use_namespace(seeder.namespace)
    case = _Case(driver, seeder, EngagementRecorder(), Seen(), timeout=1.0)
    try:
        with pytest.raises(RuleBroken) as raised:
            await ProviderConformance().test_engages_on_add_and_reconciles_against_the_right_cluster(
                case, fleet
            )
    finally:
        await seeder.close()
    assert str(raised.value) == (
        "the Provider contract (get and engage agree, one status per cluster) (see "
        "docs/guides/writing-a-provider.md): provider.get('alpha') did not return within 1s"
    ), raised.value


# --- rule 5: a provider that leaves its clusters running --------------------------------------


class LeavingProvider(ClusterSetProvider):
    """Returns on cancel without stopping its set's clusters (the bug): ``ClusterSet.run`` goes on."""

    def __init__(self, configs: dict[str, mcr.ClusterConfig]) -> None:
        super().__init__("leaving provider", options=CLUSTER_OPTIONS, probe_interval=PROBE_INTERVAL)
        self.configs = configs
        self.engaging: asyncio.Task[None] | None = None

    async def run(self, aware: mcr.Aware) -> None:
        await self.clusters.sync(dict(self.configs))
        self.engaging = asyncio.create_task(self.clusters.run(aware))
        await asyncio.Event().wait()  # cancelled: returns, and the set's task runs on

    async def clean_up(self) -> None:
        """What its run() should have done, so the test leaves nothing to the next one."""
        if self.engaging is not None:
            self.engaging.cancel()
            await asyncio.gather(self.engaging, return_exceptions=True)


class LeavingDriver(ProviderDriver):
    def __init__(self) -> None:
        self.configs: dict[str, mcr.ClusterConfig] = {}
        self.provider: LeavingProvider | None = None

    def build(self) -> mcr.Provider:
        self.provider = LeavingProvider(self.configs)
        return self.provider

    def status(self, name: str) -> mcr.ClusterStatus | None:
        return self.provider.statuses().get(name) if self.provider is not None else None

    async def add(self, name: str, target: Target) -> None:
        self.configs[name] = target.config()

    async def remove(self, name: str) -> None:
        self.configs.pop(name, None)


async def test_a_provider_that_leaves_its_clusters_running_breaks_rule_5_naming_them(
    fleet: Fleet,
) -> None:
    driver = LeavingDriver()
    try:
        with pytest.raises(RuleBroken) as raised:
            await _run_case(fleet, driver, "test_an_unknown_name_raises_cluster_not_found")
    finally:
        if driver.provider is not None:
            await driver.provider.clean_up()
    message = str(raised.value)
    assert message.startswith(
        "rule 5, disengage completely (see docs/guides/writing-a-provider.md): "
        "the provider's run() returned without stopping cluster 'alpha': its tasks "
    ), message
    assert "'cluster alpha:health-probe'" in message, message
    assert "still ran after the manager stopped; also left running: 'Task-" in message, message
    assert "(ClusterSet.run)" in message, message  # the set's task, by what it runs
