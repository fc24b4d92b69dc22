"""The running world of one conformance case: the driver, the provider, the manager, the observers."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import pytest

import mcruntime as mcr

from ._controlplane import ControlPlane, User
from ._driver import Capability, ProviderDriver
from ._harness import CONFIGMAP, EngagementRecorder, Seeder, Seen, running
from ._running import wait_until


def _require(driver: ProviderDriver, *capabilities: Capability) -> None:
    for capability in capabilities:
        reason = driver.unsupported.get(capability)
        if reason is not None:
            pytest.skip(f"{type(driver).__name__}: no {capability.name}: {reason}")


def _supports(driver: ProviderDriver, capability: Capability) -> bool:
    return capability not in driver.unsupported


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


def _token_user(plane: ControlPlane, case: _Case, role: str) -> User:
    return plane.add_token_user(f"conformance-{case.seeder.token}-{role}")
