"""The provider conformance suite, run against the core's own providers.

The single, static and multi providers are fed from code, so their drivers are
thin: the "source" is a dict of configs that the driver hands to the provider
it built. What they may skip, and why, is in each driver's ``unsupported``.
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping
from typing import ClassVar

import pytest

import mcruntime as mcr
from mcruntime.testing.conformance import (
    CLUSTER_OPTIONS,
    PROBE_INTERVAL,
    Capability,
    ProviderConformance,
    ProviderDriver,
    Target,
)


class SingleDriver(ProviderDriver):
    """One cluster, named and configured when the provider is built."""

    unsupported: ClassVar[Mapping[Capability, str]] = {
        Capability.RUNTIME_CHANGES: "SingleProvider's cluster is fixed when it is constructed",
        Capability.MULTIPLE_CLUSTERS: "SingleProvider holds exactly one cluster",
        Capability.CREDENTIAL_CHANGE: "SingleProvider's config cannot change after construction",
        Capability.DUPLICATE_NAMES: "SingleProvider has one name",
        Capability.UNPARSEABLE_SOURCE: "fed from code: a config is an object, never text to parse",
    }

    def __init__(self) -> None:
        self._source: tuple[str, Target] | None = None
        self.provider: mcr.SingleProvider | None = None

    def build(self) -> mcr.Provider:
        assert self._source is not None, "the suite adds the cluster before building"
        name, target = self._source
        self.provider = mcr.SingleProvider(
            name, target.config(), options=CLUSTER_OPTIONS, probe_interval=PROBE_INTERVAL
        )
        return self.provider

    def status(self, name: str) -> mcr.ClusterStatus | None:
        return self.provider.statuses().get(name) if self.provider is not None else None

    async def add(self, name: str, target: Target) -> None:
        assert self.provider is None, "SingleProvider cannot gain a cluster while it runs"
        assert self._source is None or self._source[0] == name, "SingleProvider holds one cluster"
        self._source = (name, target)

    async def remove(self, name: str) -> None:
        raise AssertionError("the suite removed a cluster from a SingleProvider")


class StaticDriver(ProviderDriver):
    """The source is the dict the provider starts from, then its add/update/remove calls."""

    unsupported: ClassVar[Mapping[Capability, str]] = {
        Capability.DUPLICATE_NAMES: "StaticProvider's names are dict keys, unique by construction",
        Capability.UNPARSEABLE_SOURCE: "fed from code: a config is an object, never text to parse",
    }

    def __init__(self) -> None:
        self._source: dict[str, mcr.ClusterConfig] = {}
        self.provider: mcr.StaticProvider | None = None

    def build(self) -> mcr.Provider:
        self.provider = mcr.StaticProvider(
            self._source, options=CLUSTER_OPTIONS, probe_interval=PROBE_INTERVAL
        )
        return self.provider

    def status(self, name: str) -> mcr.ClusterStatus | None:
        return self.provider.statuses().get(name) if self.provider is not None else None

    async def add(self, name: str, target: Target) -> None:
        config = target.config()
        self._source[name] = config
        if self.provider is not None:
            await self.provider.set(name, config)

    async def change(self, name: str, target: Target) -> None:
        config = target.config()
        self._source[name] = config
        if self.provider is not None:
            await self.provider.set(name, config)

    async def remove(self, name: str) -> None:
        self._source.pop(name, None)
        if self.provider is not None:
            await self.provider.remove(name)


class MultiDriver(ProviderDriver):
    """Two static providers under a MultiProvider; each name lives in one of them.

    Names are spread over both prefixes by a stable hash, so churn runs through
    both inner providers at once.
    """

    unsupported: ClassVar[Mapping[Capability, str]] = {
        Capability.DUPLICATE_NAMES: "MultiProvider prefixes are unique and may not contain the separator",
        Capability.UNPARSEABLE_SOURCE: "fed from code: a config is an object, never text to parse",
    }
    prefixes = ("east", "west")

    def __init__(self) -> None:
        self.inner = {prefix: StaticDriver() for prefix in self.prefixes}

    def _route(self, name: str) -> tuple[str, StaticDriver]:
        prefix = self.prefixes[zlib.crc32(name.encode()) % len(self.prefixes)]
        return prefix, self.inner[prefix]

    def engaged_name(self, name: str) -> str:
        prefix, _driver = self._route(name)
        return f"{prefix}/{name}"

    def build(self) -> mcr.Provider:
        return mcr.MultiProvider({prefix: driver.build() for prefix, driver in self.inner.items()})

    def status(self, name: str) -> mcr.ClusterStatus | None:
        return self._route(name)[1].status(name)

    async def add(self, name: str, target: Target) -> None:
        await self._route(name)[1].add(name, target)

    async def change(self, name: str, target: Target) -> None:
        await self._route(name)[1].change(name, target)

    async def remove(self, name: str) -> None:
        await self._route(name)[1].remove(name)


class TestSingleProvider(ProviderConformance):
    @pytest.fixture
    def driver(self) -> ProviderDriver:
        return SingleDriver()


class TestStaticProvider(ProviderConformance):
    @pytest.fixture
    def driver(self) -> ProviderDriver:
        return StaticDriver()


class TestMultiProvider(ProviderConformance):
    @pytest.fixture
    def driver(self) -> ProviderDriver:
        return MultiDriver()


def test_the_multi_driver_spreads_the_suite_names_over_both_providers() -> None:
    """Otherwise the multi provider's runs would exercise only one inner provider."""
    driver = MultiDriver()
    prefixes = {driver.engaged_name(name).split("/")[0] for name in ("alpha", "beta", "gamma", "delta")}
    assert prefixes == {"east", "west"}
