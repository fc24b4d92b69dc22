"""The conformance suite fails a provider that breaks rule 1, and says so by the rule's name.

A provider written from the guide that empties its fleet when its source stops
parsing passed every case before the suite could make a source unparseable.
Here is such a provider, and the rule-1 case run against it must fail naming
"rule 1, only the source says gone" and what it saw.
"""

from __future__ import annotations

import pytest
import yaml

import mcruntime as mcr
from mcruntime.provider import ClusterSetProvider
from mcruntime.testing import Fleet
from mcruntime.testing._case import _Case
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
