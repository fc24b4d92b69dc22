"""The conformance suite checks rule 7, the fleet it needs, and names the rule when a wait runs out.

A provider written from the guide quoted a broken source's content (token
included) in its status and its log, and passed every case: the suite checked
rule 7 only in an unhealthy cluster's ``error``. Here are such providers, and
the cases run against them must fail naming rule 7 and where the credential
appeared, without quoting it.
"""

from __future__ import annotations

import logging
import sys
from types import SimpleNamespace
from typing import cast

import pytest
import yaml

import mcruntime as mcr
from mcruntime.provider import ClusterSetProvider, SourceStatus
from mcruntime.testing import ControlPlane, Fleet, User
from mcruntime.testing._case import _Case, _require_fleet
from mcruntime.testing._checks import RuleBroken, eventually
from mcruntime.testing._harness import EngagementRecorder, Seeder, Seen
from mcruntime.testing._leaks import HIDDEN, LeakWatch
from mcruntime.testing.conformance import (
    CLUSTER_OPTIONS,
    PROBE_INTERVAL,
    Breakage,
    ProviderConformance,
    ProviderDriver,
    Target,
)

log = logging.getLogger("conformance-test.leaky")
SECRET = "s3cr3t-t0ken-Zq9XwVb7LmN2pR4k"


class LeakyProvider(ClusterSetProvider):
    """Kubeconfig texts by name, kept on their last good config; ``leak`` says how it breaks rule 7."""

    def __init__(self, texts: dict[str, str], leak: str | None) -> None:
        super().__init__("leaky provider", options=CLUSTER_OPTIONS, probe_interval=PROBE_INTERVAL)
        self.texts, self.leak = texts, leak
        self.last_good: dict[str, mcr.ClusterConfig] = {}
        self._sources: dict[str, SourceStatus] = {}

    def sources(self) -> dict[str, SourceStatus]:
        return dict(self._sources)

    async def run(self, aware: mcr.Aware) -> None:
        await self.apply()
        await self.clusters.run(aware)

    async def apply(self) -> None:
        sources = {}
        for name, text in self.texts.items():
            error = None
            try:
                self.last_good[name] = mcr.kubeconfig_from_yaml(text, origin=name)
            except mcr.KubeconfigError:
                error = f"text {name!r}: not YAML" + (f": {text}" if self.leak == "status" else "")
                if self.leak == "log":
                    log.warning("text %r does not parse: %s", name, text)
            sources[name] = SourceStatus("text", name, cluster=name, engaged=True, error=error)
        self.last_good = {name: config for name, config in self.last_good.items() if name in self.texts}
        self._sources = sources
        await self.clusters.sync(self.last_good)


class LeakyDriver(ProviderDriver):
    def __init__(self, leak: str | None = None, *, drops: str | None = None) -> None:
        self.leak, self.drops = leak, drops  # drops: a name never written (it is never engaged)
        self.texts: dict[str, str] = {}
        self.targets: dict[str, Target] = {}
        self.provider: LeakyProvider | None = None

    def build(self) -> mcr.Provider:
        self.provider = LeakyProvider(self.texts, self.leak)
        return self.provider

    def status(self, name: str) -> mcr.ClusterStatus | None:
        return self.provider.statuses().get(name) if self.provider is not None else None

    async def _put(self, name: str, text: str | None) -> None:
        if text is None:
            self.texts.pop(name, None)
        elif name != self.drops:
            self.texts[name] = text
        if self.provider is not None:
            await self.provider.apply()

    async def add(self, name: str, target: Target) -> None:
        self.targets[name] = target
        await self._put(name, yaml.safe_dump(target.kubeconfig()))

    async def corrupt(self, name: str) -> None:  # a bad edit that still holds the token
        await self._put(
            name, f"users: [{{user: {{token: {self.targets[name].token}}}}}]\nclusters: [unclosed\n"
        )

    async def remove(self, name: str) -> None:
        await self._put(name, None)


async def _run_case(fleet: Fleet, driver: ProviderDriver, case_name: str, **arguments: object) -> None:
    seeder = Seeder()
    driver.use_namespace(seeder.namespace)
    case = _Case(driver, seeder, EngagementRecorder(), Seen(), timeout=3.0)
    try:
        await getattr(ProviderConformance(), case_name)(case, fleet, **arguments)
    finally:
        await seeder.close()


UNPARSEABLE = "test_an_unparseable_source_keeps_its_cluster_and_reports_why"


async def test_a_credential_quoted_in_a_status_breaks_rule_7_naming_the_field(fleet: Fleet) -> None:
    with pytest.raises(RuleBroken) as raised:
        await _run_case(fleet, LeakyDriver("status"), UNPARSEABLE)
    message = str(raised.value)
    assert message.startswith(
        "rule 7, credentials stay out of sight (see docs/guides/writing-a-provider.md): "
    )
    where = "the token of user 'token-user' of cluster-1 appears in provider.statuses()['alpha'].source.error"
    assert where in message, message
    assert "after its source stopped parsing" in message
    assert str(fleet["cluster-1"].token_user.token) not in message


async def test_a_credential_in_a_log_record_breaks_rule_7_naming_the_logger(fleet: Fleet) -> None:
    with pytest.raises(RuleBroken) as raised:
        await _run_case(fleet, LeakyDriver("log"), UNPARSEABLE)
    message = str(raised.value)
    assert message.startswith("rule 7, credentials stay out of sight")
    assert "appears in a log record of logger 'conformance-test.leaky' (WARNING)" in message, message
    assert str(fleet["cluster-1"].token_user.token) not in message


async def test_a_provider_that_says_where_not_what_passes(fleet: Fleet) -> None:
    await _run_case(fleet, LeakyDriver(), UNPARSEABLE)


async def test_a_broken_cluster_never_engaged_fails_naming_rule_1_and_what_was_seen(fleet: Fleet) -> None:
    with pytest.raises(RuleBroken) as raised:
        await _run_case(
            fleet,
            LeakyDriver(drops="beta"),
            "test_a_broken_cluster_is_unhealthy_present_and_isolated",
            breakage=Breakage.UNREACHABLE,
        )
    message = str(raised.value)
    assert message.startswith("rule 1, only the source says gone (see docs/guides/writing-a-provider.md): ")
    assert "not within 3s: cluster 'beta' reported unhealthy; 'beta' was never engaged" in message, message
    assert "its status is None" in message


def test_a_fleet_without_three_clusters_fails_up_front_naming_the_option() -> None:
    small = cast("Fleet", SimpleNamespace(names=["cluster-1", "cluster-2"]))
    with pytest.raises(pytest.fail.Exception) as raised:
        _require_fleet(small)
    assert "run pytest with --testbed-clusters=3" in str(raised.value)
    assert "['cluster-1', 'cluster-2']" in str(raised.value)
    _require_fleet(cast("Fleet", SimpleNamespace(names=["cluster-1", "cluster-2", "cluster-3", "x"])))


async def test_a_wait_that_runs_out_names_the_rule_and_what_was_seen() -> None:
    with pytest.raises(RuleBroken) as raised:
        await eventually(
            lambda: False, "rule 5, disengage completely", "'a' gone", seen=lambda: "it is not", timeout=0.1
        )
    assert str(raised.value) == (
        "rule 5, disengage completely (see docs/guides/writing-a-provider.md): not within 0.1s: 'a' gone; it is not"
    )


# --- the watch itself --------------------------------------------------------------------


def test_the_watch_finds_a_credential_whole_or_in_part_and_says_whose() -> None:
    watch = LeakWatch()
    watch.add("the token of user 'u' of cluster-1", SECRET)
    assert watch.found_in(f"bad: {SECRET}!") == "the token of user 'u' of cluster-1"
    assert watch.found_in(f"line 3: token: {SECRET[:14]}") == "the token of user 'u' of cluster-1"
    assert watch.found_in(f"line 3: token: {SECRET[:8]}") is None
    assert watch.found_in("Secret ns/east key 'kubeconfig': not YAML (line 3)") is None


def test_redaction_hides_every_quoted_credential() -> None:
    watch = LeakWatch()
    watch.add("a token", SECRET)
    assert watch.redact(f"x {SECRET} y {SECRET[10:]} z") == f"x {HIDDEN} y {HIDDEN} z"
    assert watch.redact("nothing here") == "nothing here"


def test_the_suites_bad_tokens_match_on_their_random_part_only() -> None:
    plane = SimpleNamespace(
        name="fake",
        server="https://127.0.0.1:1",
        ca=SimpleNamespace(cert_pem=b""),
        token_user=User("u", token=SECRET),
    )
    bad = Target.of(cast("ControlPlane", plane), breakage=Breakage.BAD_CREDENTIAL)
    watch = LeakWatch()
    watch.add_target(bad)
    assert bad.token is not None and watch.found_in(f"token {bad.token}") == "the bad token of a target"
    assert watch.found_in(SECRET) is None  # the user's own token was not written
    assert watch.found_in("namespace conformance-0123abcd is gone; conformance-invalid-") is None


def test_the_log_watch_sees_messages_and_tracebacks_and_keeps_no_text() -> None:
    watch = LeakWatch()
    watch.add("a token", SECRET)
    quiet = logging.getLogger("conformance-test.quiet")
    with watch.watching():
        quiet.warning("context %s is broken", "east")
        assert watch.logged == []
        try:
            raise ValueError(f"cannot parse {SECRET}")
        except ValueError:
            quiet.error("parse failed", exc_info=sys.exc_info())
    quiet.error("after the watch: %s", SECRET)
    assert watch.logged == ["a token appears in a log record of logger 'conformance-test.quiet' (ERROR)"]
