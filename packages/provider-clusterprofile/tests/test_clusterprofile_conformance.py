"""ClusterProfileProvider through the core's conformance suite: the source is a namespace of the hub."""

from __future__ import annotations

from typing import ClassVar

import pytest
from clusterprofile_hub import Hub, status_of

import mcruntime as mcr
from mcruntime.testing import Target
from mcruntime.testing.conformance import Capability, ProviderConformance, ProviderDriver
from mcruntime_clusterprofile import ClusterProfileProvider


class ClusterProfileDriver(ProviderDriver):
    """The source is a namespace of the hub: a healthy ClusterProfile per cluster."""

    unsupported: ClassVar[dict[Capability, str]] = {
        Capability.DUPLICATE_NAMES: "names are <namespace>/<name> of ClusterProfiles, unique by construction",
    }

    def __init__(self, hub: Hub) -> None:
        self.hub = hub
        self.provider: ClusterProfileProvider | None = None
        self.touches = 0
        self.targets: dict[str, Target] = {}

    def build(self) -> mcr.Provider:
        self.provider = self.hub.provider()
        return self.provider

    def engaged_name(self, name: str) -> str:
        return self.hub.key(name)

    def status(self, name: str) -> mcr.ClusterStatus | None:
        return self.provider.statuses().get(self.hub.key(name)) if self.provider is not None else None

    async def add(self, name: str, target: Target) -> None:
        self.targets[name] = target
        await self.hub.profile(name, target)

    async def corrupt(self, name: str) -> None:
        entry = self.hub.access_entry(self.targets[name])
        entry["cluster"]["server"] = "https://[::1"  # a bad edit: no URL
        await self.hub.write(name, status_of([entry]))

    async def touch(self, name: str, target: Target) -> None:
        self.touches += 1
        await self.hub.profile(name, target, annotations={"touched": str(self.touches)})

    async def remove(self, name: str) -> None:
        await self.hub.delete(name)

    async def settle(self) -> None:
        assert self.provider is not None
        await self.hub.settled(self.provider)


class TestClusterProfileProviderConformance(ProviderConformance):
    @pytest.fixture
    def driver(self, hub: Hub) -> ProviderDriver:
        return ClusterProfileDriver(hub)
