"""KindProvider through the core's provider conformance suite, its source the stand-in ``kind``."""

from __future__ import annotations

from typing import ClassVar

import pytest
from kind_standin import FakeKind

import mcruntime as mcr
from mcruntime.testing.conformance import (
    CLUSTER_OPTIONS,
    PROBE_INTERVAL,
    Capability,
    ProviderConformance,
    ProviderDriver,
    Target,
)
from mcruntime_kind import KindProvider


class KindDriver(ProviderDriver):
    """The source is the stand-in's state: each cluster is a kind cluster serving the target's kubeconfig."""

    unsupported: ClassVar[dict[Capability, str]] = {
        Capability.DUPLICATE_NAMES: "kind lists each cluster name once: names are distinct container labels",
    }

    def __init__(self, kind: FakeKind) -> None:
        self.kind = kind
        self.provider: KindProvider | None = None

    def build(self) -> mcr.Provider:
        self.provider = KindProvider(
            poll_interval=0.2, options=CLUSTER_OPTIONS, probe_interval=PROBE_INTERVAL
        )
        return self.provider

    def status(self, name: str) -> mcr.ClusterStatus | None:
        return self.provider.statuses().get(name) if self.provider is not None else None

    async def add(self, name: str, target: Target) -> None:
        self.kind.create(name, target.kubeconfig())

    async def corrupt(self, name: str) -> None:
        self.kind.readable(name, False)  # `kind get kubeconfig` fails: the listing still names it

    async def remove(self, name: str) -> None:
        self.kind.delete(name)

    async def settle(self) -> None:
        assert self.provider is not None
        await self.provider.next_poll()


class TestKindProvider(ProviderConformance):
    @pytest.fixture
    def driver(self, kind: FakeKind) -> ProviderDriver:
        return KindDriver(kind)
