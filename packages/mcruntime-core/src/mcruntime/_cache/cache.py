"""A cluster's cache: shared informers started on first read, field indexes, a reader.

Reads never touch the API server once an informer has synced: a fleet of
hundreds of clusters is only affordable if reconciles read locally. One informer
serves each (kind, namespace, selector); the reader's own reads use the
cluster-wide informer of a kind and filter locally, as controller-runtime does.

Reads return **copies**: a reconciler may mutate what it read and send it back
with ``client.update``, and no caller can corrupt the shared store. A copy
costs a fraction of what decoding the object did; ``get``/``list`` document it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any

from .._base.errors import NotFound
from .._base.kind import Kind
from .._base.labels import LabelSelector
from .._base.objects import JSON, json_copy, metadata
from .._base.tasks import TaskSet
from .._client.client import Client
from .informer import IndexFunc, Informer, Transform, strip_managed_fields

log = logging.getLogger("mcruntime.cache")

InformerKey = tuple[Kind, str | None, str, str | None]


class CacheSyncTimeout(TimeoutError):
    """An informer did not finish its first list in time."""


class Cache:
    """Informers for one cluster, owned by that cluster's :class:`TaskSet`."""

    def __init__(
        self,
        client: Client,
        tasks: TaskSet,
        *,
        sync_timeout: float = 60.0,
        transform: Transform | None = strip_managed_fields,
        resync_period: float | None = None,
        read_timeout: float = 90.0,
        namespace: str | None = None,
    ) -> None:
        self.client = client
        self.namespace = namespace
        self._tasks = tasks
        self._sync_timeout = sync_timeout
        self._transform = transform
        self._resync_period = resync_period
        self._read_timeout = read_timeout
        self._informers: dict[InformerKey, Informer] = {}
        self._indexes: dict[Kind, dict[str, IndexFunc]] = {}

    @property
    def cluster(self) -> str:
        return self.client.cluster

    def informers(self) -> list[Informer]:
        """Every informer started so far."""
        return list(self._informers.values())

    def informer(
        self,
        kind: Kind,
        *,
        namespace: str | None = None,
        label_selector: str | Mapping[str, str] | None = None,
        field_selector: str | None = None,
    ) -> Informer:
        """The shared informer for this scope, created and started on first request."""
        namespace = self._scope(namespace)
        selector = LabelSelector.parse(label_selector).text
        key: InformerKey = (kind, namespace, selector, field_selector)
        informer = self._informers.get(key)
        if informer is None:
            informer = Informer(
                self.client,
                kind,
                namespace=namespace,
                label_selector=selector or None,
                field_selector=field_selector,
                transform=self._transform,
                resync_period=self._resync_period,
                read_timeout=self._read_timeout,
            )
            for name, extract in self._indexes.get(kind, {}).items():
                informer.add_index(name, extract)
            self._informers[key] = informer
            scope = "".join(
                (f" namespace={namespace}" if namespace else "", f" labels={selector}" if selector else "")
            )
            self._tasks.supervise(informer.run, f"informer:{kind}{scope}")
        return informer

    def index_field(self, kind: Kind, name: str, extract: IndexFunc) -> None:
        """Index objects of ``kind`` by ``extract(obj)`` (a list of strings).

        Applies to this kind's informers that exist now and to those started
        later; registering again under the same name replaces the function.
        """
        self._indexes.setdefault(kind, {})[name] = extract
        for (informer_kind, *_rest), informer in self._informers.items():
            if informer_kind == kind:
                informer.add_index(name, extract)

    def indexes(self, kind: Kind) -> list[str]:
        return sorted(self._indexes.get(kind, {}))

    def _scope(self, namespace: str | None) -> str | None:
        """The namespace to cache: the cache's own when it has one (never another)."""
        if self.namespace is None:
            return namespace
        if namespace not in (None, self.namespace):
            raise ValueError(
                f"cluster {self.cluster!r}: the cache holds namespace {self.namespace!r} only "
                f"(ClusterOptions.cache_namespace), not {namespace!r}; read it with the client"
            )
        return self.namespace

    async def _synced(self, kind: Kind) -> Informer:
        informer = self.informer(kind)
        if not informer.has_synced and not await informer.wait_for_sync(self._sync_timeout):
            raise CacheSyncTimeout(
                f"cluster {self.cluster!r}: the cache of {kind} did not sync within {self._sync_timeout:.0f}s"
                + (f" (last error: {informer.stats.last_error})" if informer.stats.last_error else "")
            )
        return informer

    async def wait_for_sync(self, timeout: float | None = None) -> bool:
        """Wait for every informer started so far; ``False`` if ``timeout`` passed first."""
        informers = list(self._informers.values())
        results = await asyncio.gather(*(informer.wait_for_sync(timeout) for informer in informers))
        return all(results)

    @property
    def has_synced(self) -> bool:
        return all(informer.has_synced for informer in self._informers.values())

    # --- the reader ----------------------------------------------------------------------

    async def get(self, kind: Kind, name: str, *, namespace: str | None = None) -> JSON:
        """A copy of one object from the cache; raises :class:`NotFound` when the cache has none.

        The same convention as :meth:`Client.get`, so code moves between a live
        read and a cached one without changing its error handling. Starts the
        kind's informer on first use and waits for it to sync.
        """
        found = await self.get_or_none(kind, name, namespace=namespace)
        if found is None:
            raise NotFound(
                f"{kind.kind} {name!r} not found in the cache",
                cluster=self.client.cluster,
                status=404,
                reason="NotFound",
                kind=kind.kind,
                namespace=namespace,
                name=name,
            )
        return found

    async def get_or_none(self, kind: Kind, name: str, *, namespace: str | None = None) -> JSON | None:
        """A copy of one object from the cache, or ``None`` when the cache has none.

        For reconcilers where a missing object is the ordinary case (it was
        deleted), so no exception is needed to say so.
        """
        self._scope(namespace)
        informer = await self._synced(kind)
        found = informer.get(f"{namespace}/{name}" if namespace else name)
        return json_copy(found) if found is not None else None

    async def list(
        self,
        kind: Kind,
        *,
        namespace: str | None = None,
        label_selector: str | Mapping[str, str] | None = None,
        index: tuple[str, str] | None = None,
    ) -> list[JSON]:
        """Copies of the matching objects; ``index=(name, value)`` uses a field index."""
        self._scope(namespace)
        informer = await self._synced(kind)
        selector = LabelSelector.parse(label_selector)
        if index is not None:
            candidates = informer.store.by_index(*index)
            if namespace is not None:
                candidates = [obj for obj in candidates if metadata(obj).get("namespace") == namespace]
        else:
            candidates = informer.list(namespace)
        return [
            json_copy(obj)
            for obj in candidates
            if selector.empty or selector.matches(metadata(obj).get("labels"))
        ]


def field_getter(*path: str) -> IndexFunc:
    """An index function for one field by path, e.g. ``field_getter("spec", "nodeName")``."""

    def extract(obj: JSON) -> list[str]:
        value: Any = obj
        for part in path:
            if not isinstance(value, dict):
                return []
            value = value.get(part)
        if value is None:
            return []
        if isinstance(value, list):
            return [str(item) for item in value]
        return [str(value)]

    return extract
