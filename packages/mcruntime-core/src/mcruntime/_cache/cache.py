"""A cluster's cache: shared informers started on first read, field indexes, a reader.

Reads never touch the API server once an informer has synced: a fleet of
hundreds of clusters is only affordable if reconciles read locally. One informer
serves each (kind, namespaces, selectors, metadata-only); the reader's own
reads use the kind's default view, the scope :class:`CacheOptions` and its
``by_object`` give it (all namespaces and objects unless narrowed), and filter
locally, as controller-runtime does. A scope of several namespaces is one
informer with a list-and-watch per namespace, so reads merge them for free.

Metadata-only is a second view of a kind (``metadata_only=True`` on reads and
on the builder's sources), with its own informer: objects there carry
``apiVersion``, ``kind`` and ``metadata`` only, which is what a controller that
needs names, labels and owners should pay for.

Reads return **copies**: a reconciler may mutate what it read and send it back
with ``client.update``, and no caller can corrupt the shared store. A copy
costs a fraction of what decoding the object did; ``get``/``list`` document it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

from .._base.backoff import Backoff
from .._base.errors import NotFound
from .._base.kind import Kind
from .._base.labels import LabelSelector
from .._base.objects import JSON, json_copy, metadata
from .._base.tasks import TaskSet
from .._client.client import Client
from .informer import IndexFunc, Informer, Transform, strip_managed_fields
from .options import CacheOptions, NamespaceNotCached

log = logging.getLogger("mcruntime.cache")

InformerKey = tuple[Kind, tuple[str, ...] | None, str, str | None, bool]


class _KindScope(NamedTuple):
    """What the cache holds of one kind: the cluster's defaults overlaid by its ``ByObject``."""

    namespaces: tuple[str, ...] | None
    label_selector: str
    field_selector: str | None
    transform: Transform | None


def _both(first: str | None, second: str | None) -> str | None:
    """Two selectors that must both hold (the API server ANDs comma-separated terms)."""
    return ",".join(part for part in (first, second) if part) or None


class CacheSyncTimeout(TimeoutError):
    """An informer did not finish its first list in time."""


async def synced(informer: Informer, cluster: str, timeout: float, client: Client) -> Informer:
    """``informer`` once its first list is in, or :class:`CacheSyncTimeout` (naming ``cluster``).

    A kind the cluster does not serve (a typo, a CRD not installed there yet)
    raises ``KindNotFound`` at once, as the client does, instead of holding
    the read for ``timeout`` while the informer retries.
    """
    if informer.has_synced:
        return informer
    await client.resource(informer.kind)  # discovery, cached: refreshed once when the kind is missing
    if not await informer.wait_for_sync(timeout):
        raise CacheSyncTimeout(
            f"cluster {cluster!r}: the cache of {informer.kind} did not sync within {timeout:.0f}s"
            + (f" (last error: {informer.stats.last_error})" if informer.stats.last_error else "")
        )
    return informer


def not_found(cluster: str, kind: Kind, name: str, namespace: str | None) -> NotFound:
    """What a cache read of an object it does not hold raises, as a live read would."""
    return NotFound(
        f"{kind.kind} {name!r} not found in the cache",
        cluster=cluster,
        status=404,
        reason="NotFound",
        kind=kind.kind,
        namespace=namespace,
        name=name,
    )


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
        options: CacheOptions | None = None,
        backoff: Backoff | None = None,
    ) -> None:
        options = options or CacheOptions()
        if namespace is not None and options.namespaces is not None:
            raise ValueError(
                f"cluster {client.cluster!r}: give the cache one namespace "
                "or CacheOptions.namespaces, not both"
            )
        self.client = client
        self.options: CacheOptions = (
            CacheOptions(namespaces=(namespace,), by_object=options.by_object) if namespace else options
        )
        self._tasks = tasks
        self._sync_timeout = sync_timeout
        self._transform = transform
        self._resync_period = resync_period
        self._read_timeout = read_timeout
        self._backoff = backoff
        self._informers: dict[InformerKey, Informer] = {}
        # Memos of the read path (every reconcile reads): the options are frozen, and an
        # informer once made is never replaced, so both hold for the cache's life.
        self._scopes: dict[Kind, _KindScope] = {}
        self._default_views: dict[tuple[Kind, bool], Informer] = {}
        self._namespaced: dict[Kind, bool] = {}  # learnt from discovery at a kind's first read
        self._indexes: dict[Kind, dict[str, IndexFunc]] = {}

    @property
    def cluster(self) -> str:
        return self.client.cluster

    @property
    def namespace(self) -> str | None:
        """The namespace when the cache holds exactly one by default, else ``None``."""
        namespaces = self.namespaces
        return namespaces[0] if namespaces is not None and len(namespaces) == 1 else None

    @property
    def namespaces(self) -> tuple[str, ...] | None:
        """The namespaces cached by default (``None``: all); ``ByObject`` may differ per kind."""
        return self.options.namespaces  # type: ignore[return-value]  # normalised to a tuple

    def scope(self, kind: Kind) -> tuple[tuple[str, ...] | None, str | None, str | None]:
        """The namespaces (``None``: all), label selector and field selector cached for ``kind``."""
        found = self._kind_scope(kind)
        return found.namespaces, found.label_selector or None, found.field_selector

    def _kind_scope(self, kind: Kind) -> _KindScope:
        found = self._scopes.get(kind)
        if found is not None:
            return found
        by_object = self.options.by_object.get(kind)
        if by_object is None:
            found = _KindScope(self.namespaces, "", None, self._transform)
        else:
            namespaces: tuple[str, ...] | None = (
                tuple(by_object.namespaces) if by_object.namespaces is not None else self.namespaces
            )
            found = _KindScope(
                namespaces,
                LabelSelector.parse(by_object.label_selector).text,
                by_object.field_selector,
                by_object.transform_or(self._transform),
            )
        self._scopes[kind] = found
        return found

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
        metadata_only: bool = False,
    ) -> Informer:
        """The shared informer for this scope, created and started on first request.

        Without arguments it is the kind's default view, the one reads use.
        ``namespace`` narrows it to one of the cached namespaces (another raises
        :class:`NamespaceNotCached`); selectors given here apply on top of the
        kind's ``ByObject`` selectors, never instead of them.
        """
        default_view = namespace is None and label_selector is None and field_selector is None
        if default_view and (found := self._default_views.get((kind, metadata_only))) is not None:
            return found  # the view every read uses: no scope to work out again
        scope = self._kind_scope(kind)
        namespaces = scope.namespaces
        if namespace is not None:
            self._check_namespace(kind, namespace)
            namespaces = (namespace,)
        extra = LabelSelector.parse(label_selector).text
        selector = LabelSelector.parse(_both(scope.label_selector, extra)).text
        fields = _both(scope.field_selector, field_selector)
        key: InformerKey = (kind, namespaces, selector, fields, metadata_only)
        informer = self._informers.get(key)
        if informer is None:
            informer = Informer(
                self.client,
                kind,
                namespaces=namespaces,
                metadata_only=metadata_only,
                label_selector=selector or None,
                field_selector=fields,
                transform=scope.transform,
                resync_period=self._resync_period,
                read_timeout=self._read_timeout,
                backoff=self._backoff,
            )
            for name, extract in self._indexes.get(kind, {}).items():
                informer.add_index(name, extract)
            self._informers[key] = informer
            label = "".join(
                (
                    f" namespaces={','.join(namespaces)}" if namespaces else "",
                    f" labels={selector}" if selector else "",
                    f" fields={fields}" if fields else "",
                    " metadata-only" if metadata_only else "",
                )
            )
            self._tasks.supervise(informer.run, f"informer:{kind}{label}")
        if default_view:
            self._default_views[(kind, metadata_only)] = informer
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

    def _check_namespace(self, kind: Kind, namespace: str | None) -> None:
        """Refuse a read of a namespace this kind is not cached in: "absent" would be a lie."""
        cached = self._kind_scope(kind).namespaces
        if namespace is not None and cached is not None and namespace not in cached:
            raise NamespaceNotCached(self.cluster, kind, namespace, cached)

    async def _synced(self, kind: Kind, metadata_only: bool = False) -> Informer:
        informer = self._default_views.get((kind, metadata_only))
        if informer is not None and informer.has_synced:
            return informer  # every read after the first: no scope to work out, nothing to wait for
        informer = self.informer(kind, metadata_only=metadata_only)
        return await synced(informer, self.cluster, self._sync_timeout, self.client)

    async def _learn_scope(self, kind: Kind) -> bool:
        """Whether ``kind`` is namespaced, from discovery (once per kind); ``KindNotFound`` if not served."""
        namespaced = self._namespaced[kind] = (await self.client.resource(kind)).namespaced
        return namespaced

    def _read_namespace(
        self, kind: Kind, name: str | None, namespace: str | None, namespaced: bool
    ) -> str | None:
        """The namespace a read addresses, as the client would: none for a cluster-scoped kind.

        A namespaced object asked for without a namespace is refused, as the
        live client refuses it: "absent" would tell a reconciler it was deleted.
        """
        if not namespaced:
            return None
        if not namespace and name is not None:
            raise ValueError(f"{kind.kind} is namespaced: give a namespace for {name!r}")
        self._check_namespace(kind, namespace)
        return namespace

    async def wait_for_sync(self, timeout: float | None = None) -> bool:
        """Wait for every informer started so far; ``False`` if ``timeout`` passed first."""
        informers = list(self._informers.values())
        results = await asyncio.gather(*(informer.wait_for_sync(timeout) for informer in informers))
        return all(results)

    @property
    def has_synced(self) -> bool:
        return all(informer.has_synced for informer in self._informers.values())

    # --- the reader ----------------------------------------------------------------------

    async def get(
        self, kind: Kind, name: str, *, namespace: str | None = None, metadata_only: bool = False
    ) -> JSON:
        """A copy of one object from the cache; raises :class:`NotFound` when the cache has none.

        The same convention as :meth:`Client.get`, so code moves between a live
        read and a cached one without changing its error handling. Starts the
        kind's informer on first use and waits for it to sync. An object its
        ``ByObject`` selectors exclude is not found; a namespace outside the
        cache's scope raises :class:`NamespaceNotCached`. ``metadata_only``
        reads the kind's metadata view (``apiVersion``, ``kind``, ``metadata``).
        """
        found = await self.get_or_none(kind, name, namespace=namespace, metadata_only=metadata_only)
        if found is None:
            raise not_found(self.cluster, kind, name, namespace)
        return found

    async def get_or_none(
        self, kind: Kind, name: str, *, namespace: str | None = None, metadata_only: bool = False
    ) -> JSON | None:
        """A copy of one object from the cache, or ``None`` when the cache has none.

        For reconcilers where a missing object is the ordinary case (it was
        deleted), so no exception is needed to say so. A namespace outside the
        cache's scope still raises :class:`NamespaceNotCached`. As with the
        client, a cluster-scoped kind's read ignores ``namespace``, a namespaced
        kind's needs one (``ValueError``), and a kind the cluster does not serve
        raises ``KindNotFound``.
        """
        namespaced = self._namespaced.get(kind)
        if namespaced is None:
            namespaced = await self._learn_scope(kind)
        namespace = self._read_namespace(kind, name, namespace, namespaced)
        informer = await self._synced(kind, metadata_only)
        found = informer.get(f"{namespace}/{name}" if namespace else name)
        return json_copy(found) if found is not None else None

    async def list(
        self,
        kind: Kind,
        *,
        namespace: str | None = None,
        label_selector: str | Mapping[str, str] | None = None,
        index: tuple[str, str] | None = None,
        metadata_only: bool = False,
    ) -> list[JSON]:
        """Copies of the matching objects; ``index=(name, value)`` uses a field index.

        Without ``namespace`` the answer merges every cached namespace; with one
        outside the cache's scope it raises :class:`NamespaceNotCached`.
        """
        namespaced = self._namespaced.get(kind)
        if namespaced is None:
            namespaced = await self._learn_scope(kind)
        namespace = self._read_namespace(kind, None, namespace, namespaced)
        informer = await self._synced(kind, metadata_only)
        if index is not None:
            if index[0] not in self._indexes.get(kind, {}):
                known = ", ".join(repr(name) for name in self.indexes(kind)) or "none"
                raise KeyError(
                    f"cluster {self.cluster!r}: {kind} has no index named {index[0]!r} (it has: {known}); "
                    "index_field registers one (Manager.index_field is a coroutine: await it)"
                )
            candidates = informer.store.by_index(*index)
            if namespace is not None:
                candidates = [obj for obj in candidates if metadata(obj).get("namespace") == namespace]
        else:
            candidates = informer.list(namespace)
        return copies(candidates, label_selector)


def copies(candidates: Iterable[JSON], label_selector: str | Mapping[str, str] | None) -> list[JSON]:
    """Copies of the stored objects ``label_selector`` matches: what a cache's ``list`` answers."""
    selector = LabelSelector.parse(label_selector)
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
