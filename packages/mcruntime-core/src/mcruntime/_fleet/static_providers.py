"""The providers that ship with the core: single, static and multi.

Each is a thin layer over :class:`ClusterSet`, which is the point: a provider
is its discovery, and these have almost none.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Mapping

from .._base.errors import ClusterNotFound
from .._base.kind import Kind
from .._base.permissions import Permission
from .._cache.informer import IndexFunc
from .._config.kubeconfig import ClusterConfig
from .cluster import Cluster, ClusterOptions
from .clusterset_provider import ClusterSetProvider
from .protocols import Aware, DeclaresPermissions, Provider, ProviderRunnable
from .status import ClusterStatus

log = logging.getLogger("mcruntime.provider")

MEMBER_RETURNED = (
    "the run() of MultiProvider member %r (%s) returned while the manager runs: it engages and disengages "
    "no more clusters from now on (its %d known stay); a provider's run() is to run until cancelled"
)


class SingleProvider(ClusterSetProvider):
    """One named cluster, engaged on start: the smallest provider there is."""

    def __init__(
        self,
        name: str,
        config: ClusterConfig,
        *,
        options: ClusterOptions | None = None,
        probe_interval: float | None = None,
    ) -> None:
        super().__init__(f"single provider {name!r}", options=options, probe_interval=probe_interval)
        self.name = name
        self._config = config

    async def run(self, aware: Aware) -> None:
        await self.clusters.set(self.name, self._config)
        await self.clusters.run(aware)


class StaticProvider(ClusterSetProvider):
    """Clusters set and removed from code while the manager runs.

    ``set`` adds or changes a cluster and ``remove`` drops it, with the
    lifecycle rules of every other provider: setting an unchanged config does
    nothing.
    """

    def __init__(
        self,
        clusters: Mapping[str, ClusterConfig] | None = None,
        *,
        options: ClusterOptions | None = None,
        probe_interval: float | None = None,
        cluster_options: Mapping[str, ClusterOptions] | None = None,
    ) -> None:
        """``cluster_options`` gives named clusters options of their own, used whole instead of ``options``.

        A mixed fleet needs it: a member whose identity may read one namespace
        only gets ``ClusterOptions(cache=CacheOptions(namespaces=[...]))``, and
        the rest keep the shared options.
        """
        super().__init__("static provider", options=options, probe_interval=probe_interval)
        self._initial = dict(clusters or {})
        if cluster_options:
            own = dict(cluster_options)
            self.clusters.options_for = lambda name: own.get(name, self.clusters.options)

    async def run(self, aware: Aware) -> None:
        if self._initial:
            await self.clusters.sync(self._initial)
        await self.clusters.run(aware)

    async def set(self, name: str, config: ClusterConfig) -> bool:
        """Add ``name``, or change it if it exists; returns whether anything changed.

        One method for both, because callers that mirror a source of truth
        rarely know (or care) which it is. An unchanged config does nothing; a
        rotated token is swapped in place; any other change replaces the
        cluster (its caches are rebuilt).
        """
        return await self.clusters.set(name, config)

    async def remove(self, name: str) -> bool:
        """Remove a cluster; returns whether it existed."""
        return await self.clusters.remove(name)

    def names(self) -> list[str]:
        return self.clusters.names()


class _PrefixedAware:
    def __init__(self, prefix: str, separator: str, aware: Aware) -> None:
        self._prefix = prefix
        self._separator = separator
        self._aware = aware

    async def engage(self, name: str, cluster: Cluster) -> None:
        await self._aware.engage(f"{self._prefix}{self._separator}{name}", cluster)


class MultiProvider:
    """Several providers under name prefixes: ``"kind/dev"``, ``"capi/prod/eu-1"``.

    Each inner provider runs with its own discovery; names are
    ``<prefix><separator><inner name>`` so two providers can never collide.
    """

    def __init__(self, providers: Mapping[str, Provider], *, separator: str = "/") -> None:
        for prefix in providers:
            if not prefix or separator in prefix:
                raise ValueError(
                    f"provider prefix {prefix!r} must be non-empty and not contain {separator!r}"
                )
        self._providers = dict(providers)
        self._separator = separator

    def _split(self, name: str) -> tuple[Provider, str]:
        prefix, separator, inner = name.partition(self._separator)
        provider = self._providers.get(prefix)
        if provider is None or not separator:
            raise ClusterNotFound(name)
        return provider, inner

    async def get(self, name: str) -> Cluster:
        provider, inner = self._split(name)
        try:
            return await provider.get(inner)
        except ClusterNotFound:
            raise ClusterNotFound(name) from None  # the name the caller used, prefix included

    async def index_field(self, kind: Kind, name: str, extract: IndexFunc) -> None:
        await asyncio.gather(*(p.index_field(kind, name, extract) for p in self._providers.values()))

    def statuses(self) -> Mapping[str, ClusterStatus]:
        """Every inner provider's statuses, under the prefixed names the manager knows them by."""
        found: dict[str, ClusterStatus] = {}
        for prefix, provider in self._providers.items():
            for name, status in provider.statuses().items():
                full = f"{prefix}{self._separator}{name}"
                found[full] = dataclasses.replace(status, name=full)
        return found

    def rbac_rules(self) -> list[Permission]:
        """What every inner provider that declares permissions needs."""
        return [
            rule
            for provider in self._providers.values()
            if isinstance(provider, DeclaresPermissions)
            for rule in provider.rbac_rules()
        ]

    async def run(self, aware: Aware) -> None:
        runnables = [
            self._run_member(prefix, provider, aware)
            for prefix, provider in self._providers.items()
            if isinstance(provider, ProviderRunnable)
        ]
        if not runnables:  # members that only answer get(): still a run() that lasts until cancelled
            await asyncio.get_running_loop().create_future()
        async with asyncio.TaskGroup() as group:
            for runnable in runnables:
                group.create_task(runnable)

    async def _run_member(self, prefix: str, provider: Provider, aware: Aware) -> None:
        """Run one member; one whose run() returns is named, and the others run on.

        The manager names a provider whose run() returns, but it sees only the
        MultiProvider, which runs on while any member does: a member's discovery
        would end in silence.
        """
        assert isinstance(provider, ProviderRunnable)
        await provider.run(_PrefixedAware(prefix, self._separator, aware))
        log.warning(MEMBER_RETURNED, prefix, type(provider).__name__, len(provider.statuses()))
        await asyncio.get_running_loop().create_future()
