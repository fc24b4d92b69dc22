"""Which resources a cluster serves, learned cheaply and refreshed on demand.

Aggregated discovery (GA since Kubernetes 1.30) returns every group, version and
resource in two requests (``/api`` and ``/apis``); older servers get the legacy
walk, with the group-versions fetched concurrently. The result is cached per
cluster; a lookup that misses refreshes it, at most once per
a small token bucket (a burst of a few, then one per ``min_refresh_interval``),
so a CRD installed a moment ago is found at once while a controller polling for
an absent kind cannot hammer the server.

What a server serves does not depend on who asks, so clusters that reach the
same server the same way (equal endpoint fingerprints: URL, trust, proxy)
share its last answer: a thousand clusters of one server cold-start with one
load, not a thousand, and an informer retrying its LIST does not reload what a
sibling loaded a moment ago. A shared load that fails (a revoked credential,
say) is not taken as the server's answer: each waiting cluster then loads on
its own, so one cluster's trouble never stands in for another's.
"""

from __future__ import annotations

import asyncio
import time
import weakref
from collections.abc import Iterable
from typing import Any

import orjson

from .._base.errors import KindNotFound, error_from_status
from .._base.kind import Kind, Resource
from .answers import decode_answer
from .transport import Transport

_AGGREGATED = (
    "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,"
    "application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList,"
    "application/json"
)


class _ServerSurface:
    """The last load of one server's resources, whichever of its clusters made it."""

    __slots__ = ("__weakref__", "loaded_at", "loading", "resources")

    def __init__(self) -> None:
        self.resources: dict[Kind, Resource] = {}
        self.loaded_at: float | None = None
        # The load in flight: resolves to its resources, or to None if it failed.
        self.loading: asyncio.Future[dict[Kind, Resource] | None] | None = None


# Held by the Discovery objects of live clusters only: a server's entry goes with its last cluster.
_SURFACES: weakref.WeakValueDictionary[str, _ServerSurface] = weakref.WeakValueDictionary()


def _surface(key: str) -> _ServerSurface:
    found = _SURFACES.get(key)
    if found is None:
        found = _SURFACES[key] = _ServerSurface()
    return found


class Discovery:
    """A per-cluster map from :class:`Kind` to :class:`Resource`, shared per server."""

    def __init__(
        self,
        transport: Transport,
        *,
        min_refresh_interval: float = 5.0,
        burst: int = 3,
        share: bool = True,
    ) -> None:
        self._transport = transport
        self._shared = _surface(transport.config.endpoint_fingerprint()) if share else None
        self._min_interval = min_refresh_interval
        self._burst = burst
        self._tokens = float(burst)
        self._tokens_at = time.monotonic()
        self._resources: dict[Kind, Resource] = {}
        self._loaded_at: float | None = None
        self._refreshing: asyncio.Task[None] | None = None
        self.refreshes: int = 0
        self.requests: int = 0

    async def resource_for(self, kind: Kind) -> Resource:
        """The resource serving ``kind``; raises :class:`KindNotFound` if none does."""
        found = self._resources.get(kind)
        if found is not None:
            return found
        if self._adopt(kind):
            return self._resources[kind]
        if self._loaded_at is None or self._take_token():
            await self.refresh()
        found = self._resources.get(kind)
        if found is None:
            raise KindNotFound(self._transport.cluster, kind.api_version, kind.kind)
        return found

    def stale(self, kind: Kind) -> None:
        """Forget ``kind``: the server answered its path as unserved, so the next use asks discovery again."""
        if kind in self._resources:  # a copy: the map may be the server's, shared with its other clusters
            self._resources = {known: found for known, found in self._resources.items() if known != kind}

    def _take_token(self) -> bool:
        now = time.monotonic()
        refill = (now - self._tokens_at) / self._min_interval if self._min_interval > 0 else self._burst
        self._tokens = min(float(self._burst), self._tokens + refill)
        self._tokens_at = now
        if self._tokens < 1:
            return False
        self._tokens -= 1
        return True

    def _adopt(self, kind: Kind) -> bool:
        """Take a sibling's newer load if it knows ``kind`` (no request)."""
        shared = self._shared
        if shared is None or shared.loaded_at is None or kind not in shared.resources:
            return False
        if self._loaded_at is None or shared.loaded_at > self._loaded_at:
            self._resources, self._loaded_at = shared.resources, shared.loaded_at
            return True
        return False

    async def refresh(self) -> None:
        """Reload everything; concurrent callers share one reload, and so do a server's clusters."""
        if self._refreshing is None or self._refreshing.done():
            name = f"discovery:{self._transport.cluster}"
            self._refreshing = asyncio.create_task(self._refresh(), name=name)
        await asyncio.shield(self._refreshing)

    async def _refresh(self) -> None:
        shared = self._shared
        if shared is None:
            self._publish(await self._load())
            return
        # A sibling loading right now gets an answer as new as ours would be. If its load
        # fails, the failure may be its own (a revoked credential, a cluster stopped
        # mid-load): one more shared try, then every waiter loads on its own.
        for _ in range(2):
            if shared.loading is None:
                break
            with self._transport.preparing():  # our own request follows: no probe needed meanwhile
                resources = await asyncio.shield(shared.loading)
            if resources is not None:
                self._resources, self._loaded_at = resources, shared.loaded_at
                return
        if shared.loading is not None:
            self._publish(await self._load())
            return
        loading = shared.loading = asyncio.get_running_loop().create_future()
        resources = None
        try:
            resources = await self._load()
            self._publish(resources)
        finally:
            if shared.loading is loading:
                shared.loading = None
            loading.set_result(resources)

    def _publish(self, resources: dict[Kind, Resource]) -> None:
        self._resources = resources
        self._loaded_at = time.monotonic()
        self.refreshes += 1
        shared = self._shared
        if shared is not None:
            shared.resources, shared.loaded_at = resources, self._loaded_at

    async def close(self) -> None:
        """Cancel a refresh in flight (the cluster is stopping)."""
        task, self._refreshing = self._refreshing, None
        if task is not None and not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    def resources(self) -> list[Resource]:
        """Everything known from the last load (no request)."""
        return list(self._resources.values())

    async def _get(self, path: str, accept: str = "application/json") -> Any:
        self.requests += 1
        status, _headers, body = await self._transport.request("GET", path, accept=accept)
        if status == 404:
            return None
        if status >= 300:
            raise error_from_status(
                status, decode_answer(self._transport.redact(body)), cluster=self._transport.cluster
            )
        return orjson.loads(body)

    async def _load(self) -> dict[Kind, Resource]:
        # One after the other: two requests at once would open a second pooled TLS
        # connection per cluster (with asyncio's 256 KiB read buffer) that then idles.
        core = await self._get("/api", _AGGREGATED)
        groups = await self._get("/apis", _AGGREGATED)
        resources: dict[Kind, Resource] = {}
        for document in (core, groups):
            if isinstance(document, dict) and document.get("kind") == "APIGroupDiscoveryList":
                resources.update(_from_aggregated(document))
            elif isinstance(document, dict) and document.get("kind") == "APIVersions":
                for version in document.get("versions", []):
                    resources.update(await self._legacy_group_version("", version))
            elif isinstance(document, dict) and document.get("kind") == "APIGroupList":
                lists = await asyncio.gather(
                    *(
                        self._legacy_group_version(group["name"], version["version"])
                        for group in document.get("groups", [])
                        for version in group.get("versions", [])
                    )
                )
                for found in lists:
                    resources.update(found)
        return resources

    async def _legacy_group_version(self, group: str, version: str) -> dict[Kind, Resource]:
        path = f"/apis/{group}/{version}" if group else f"/api/{version}"
        document = await self._get(path)
        if not isinstance(document, dict):
            return {}
        subresources: dict[str, set[str]] = {}
        plain: list[dict[str, Any]] = []
        for entry in document.get("resources", []):
            name = entry.get("name", "")
            if "/" in name:
                base, _, sub = name.partition("/")
                subresources.setdefault(base, set()).add(sub)
            else:
                plain.append(entry)
        found: dict[Kind, Resource] = {}
        for entry in plain:
            resource = Resource(
                group=group,
                version=version,
                plural=entry["name"],
                kind=entry["kind"],
                namespaced=bool(entry.get("namespaced")),
                verbs=frozenset(entry.get("verbs", [])),
                subresources=frozenset(subresources.get(entry["name"], ())),
            )
            kind, resource = _canonical(resource)
            found.setdefault(kind, resource)
        return found


def _from_aggregated(document: dict[str, Any]) -> Iterable[tuple[Kind, Resource]]:
    for group in document.get("items", []):
        group_name = (group.get("metadata") or {}).get("name", "")
        for version in group.get("versions", []):
            version_name = version.get("version", "")
            for entry in version.get("resources", []):
                response_kind = entry.get("responseKind") or {}
                kind_name = response_kind.get("kind")
                if not kind_name:
                    continue
                resource = Resource(
                    group=group_name,
                    version=version_name,
                    plural=entry["resource"],
                    kind=kind_name,
                    namespaced=entry.get("scope") == "Namespaced",
                    verbs=frozenset(entry.get("verbs", [])),
                    subresources=frozenset(
                        sub.get("subresource", "") for sub in entry.get("subresources") or []
                    ),
                )
                yield _canonical(resource)


_CANONICAL: dict[Resource, tuple[Kind, Resource]] = {}


def _canonical(resource: Resource) -> tuple[Kind, Resource]:
    """One shared instance per distinct resource, whichever cluster serves it.

    A fleet's clusters mostly serve the same API surface; sharing the frozen
    values cuts discovery's memory from ~110 KiB per cluster to the distinct
    resources of the whole fleet (which bounds this table, too).
    """
    found = _CANONICAL.get(resource)
    if found is None:
        found = _CANONICAL[resource] = (Kind(resource.api_version, resource.kind), resource)
    return found
