"""The cache of a namespace view: one namespace's reads, from the host's informers or its own.

:class:`NamespacedCache` checks the namespace of every call, then reads an
informer through its public methods: with shared informers, a
:class:`NamespaceInformer` (the host's informer as the namespace sees it);
otherwise an informer of a plain :class:`Cache` of the view's own, listing and
watching the namespace alone. Neither :class:`Cache` nor :class:`Informer` has
a private method overridden here.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from .._base.kind import Kind
from .._base.labels import LabelSelector
from .._base.objects import JSON, json_copy, metadata
from .._base.tasks import TaskSet
from .._cache.cache import Cache, InformerKey, copies, not_found, synced
from .._cache.informer import HandlerRegistration, IndexFunc, Informer, ResourceEventHandler
from .namespaced_client import NamespacedClient, refused

NAMESPACE_INDEX = "mcruntime.dev/namespace"
"""The host informers' index by ``metadata.namespace`` (``""`` for cluster-scoped objects)."""


def _namespace_of(obj: JSON) -> list[str]:
    return [str(metadata(obj).get("namespace") or "")]


def _visible(obj: JSON, namespace: str) -> bool:
    """Whether a view of ``namespace`` sees ``obj``: its namespace's objects and cluster-scoped ones."""
    found = metadata(obj).get("namespace")
    return not found or found == namespace


class _ScopedHandler(ResourceEventHandler):
    """A consumer's handler behind a filter: only the view's namespace (and cluster-scoped objects)."""

    def __init__(self, inner: ResourceEventHandler, namespace: str) -> None:
        on_add, on_update, on_delete = inner.on_add, inner.on_update, inner.on_delete

        def add(obj: JSON, initial: bool) -> None:
            if on_add is not None and _visible(obj, namespace):
                on_add(obj, initial)

        def update(old: JSON, new: JSON) -> None:
            if on_update is not None and _visible(new, namespace):
                on_update(old, new)

        def delete(obj: JSON) -> None:
            if on_delete is not None and _visible(obj, namespace):
                on_delete(obj)

        super().__init__(
            add if on_add else None, update if on_update else None, delete if on_delete else None
        )


class _VisibleObjects(Mapping[str, JSON]):
    """A live, read-only view of a store's objects that one namespace sees, by ``namespace/name`` key."""

    def __init__(self, objects: Mapping[str, JSON], namespace: str) -> None:
        self._objects = objects
        self._prefix = f"{namespace}/"

    def _sees(self, key: str) -> bool:
        return "/" not in key or key.startswith(self._prefix)  # cluster-scoped keys have no namespace

    def __getitem__(self, key: str) -> JSON:
        if not self._sees(key):
            raise KeyError(key)
        return self._objects[key]

    def __iter__(self) -> Iterator[str]:
        return (key for key in list(self._objects) if self._sees(key))

    def __len__(self) -> int:
        return sum(1 for _key in self)


class NamespaceInformer(Informer):
    """The host's shared informer as one namespace sees it; it never runs, the host's does.

    An :class:`Informer` by type; every public method is defined here and
    reads the shared informer through its public methods. ``store`` and
    ``stats`` are the shared informer's (every namespace's objects, one set of
    counters); ``list``, ``get``, ``view`` and handlers see the namespace only.
    """

    def __init__(self, shared: Informer, client: NamespacedClient) -> None:
        super().__init__(
            client,
            shared.kind,
            namespace=client.namespace,
            metadata_only=shared.metadata_only,
            label_selector=shared.label_selector.text or None,
            field_selector=shared.field_selector,
        )
        self.shared = shared
        self.store = shared.store
        self.stats = shared.stats
        self.presence = shared.presence  # an optional source of a view holds the shared informer
        self._own = client.namespace
        self._registrations: list[HandlerRegistration] = []

    @property
    def resource_version(self) -> str:
        return self.shared.resource_version

    @property
    def has_synced(self) -> bool:
        return self.shared.has_synced

    @property
    def failing(self) -> Exception | None:
        return self.shared.failing

    @property
    def broken(self) -> Exception | None:
        return self.shared.broken

    async def wait_for_sync(self, timeout: float | None = None) -> bool:
        return await self.shared.wait_for_sync(timeout)

    async def wait_for_sync_or_absence(self, timeout: float | None = None) -> bool:
        return await self.shared.wait_for_sync_or_absence(timeout)

    def add_handler(self, handler: ResourceEventHandler) -> HandlerRegistration:
        registration = self.shared.add_handler(_ScopedHandler(handler, self._own))
        self._registrations.append(registration)
        return registration

    def remove_handler(self, registration: HandlerRegistration) -> None:
        if registration in self._registrations:
            self._registrations.remove(registration)
        self.shared.remove_handler(registration)

    @property
    def handler_count(self) -> int:
        """The handlers added through this view (the shared informer counts every view's)."""
        return len(self._registrations)

    def add_index(self, name: str, extract: IndexFunc) -> None:
        self.shared.add_index(name, extract)

    def list(self, namespace: str | None = None) -> list[JSON]:
        if namespace not in (None, self._own):
            raise refused(self.client.cluster, self._own, self.kind.kind, namespace, None)
        if self.store.has_index(NAMESPACE_INDEX):  # what the namespace holds, not what the host holds
            return self.store.by_index(NAMESPACE_INDEX, self._own) + self.store.by_index(NAMESPACE_INDEX, "")
        return [obj for obj in self.shared.list() if _visible(obj, self._own)]

    def get(self, key: str) -> JSON | None:
        found = self.shared.get(key)
        return found if found is not None and _visible(found, self._own) else None

    def view(self) -> Mapping[str, JSON]:
        return _VisibleObjects(self.shared.view(), self._own)

    async def run(self) -> None:
        raise RuntimeError(f"{self!r} is a view: the host's informer runs, not this one")


class NamespacedCache(Cache):
    """Reads of one namespace (and of cluster-scoped kinds); another namespace is refused.

    ``source`` answers the informers: the host's cache (``shared=True``: one
    informer per kind for every view, seen through a :class:`NamespaceInformer`)
    or a cache of the view's own, scoped to the namespace. A :class:`Cache` by
    type; every public method that reads is defined here.
    """

    def __init__(
        self, source: Cache, client: NamespacedClient, tasks: TaskSet, sync_timeout: float, *, shared: bool
    ) -> None:
        super().__init__(client, tasks, sync_timeout=sync_timeout, namespace=client.namespace)
        self.source = source
        self.shared = shared
        self._view_client = client
        self._own = client.namespace
        self._timeout = sync_timeout
        self._views: dict[InformerKey, NamespaceInformer] = {}

    def _check(self, namespace: str | None) -> None:
        if namespace not in (None, self._own):
            raise refused(self.cluster, self._own, "cache", namespace, None)

    def informers(self) -> list[Informer]:
        return list(self._views.values()) if self.shared else self.source.informers()

    def informer(self, kind: Kind, *, namespace: str | None = None, **selection: Any) -> Informer:
        """The namespace's informer for this kind and selection (another namespace is refused)."""
        self._check(namespace)
        if not self.shared:
            return self.source.informer(kind, namespace=namespace, **selection)
        return self._view(kind, **selection)

    def _view(
        self,
        kind: Kind,
        *,
        label_selector: str | Mapping[str, str] | None = None,
        field_selector: str | None = None,
        metadata_only: bool = False,
    ) -> NamespaceInformer:
        selector = LabelSelector.parse(label_selector).text
        key: InformerKey = (kind, (self._own,), selector, field_selector, metadata_only)
        view = self._views.get(key)
        if view is None:
            if NAMESPACE_INDEX not in self.source.indexes(kind):
                self.source.index_field(kind, NAMESPACE_INDEX, _namespace_of)
            shared = self.source.informer(
                kind,
                label_selector=selector or None,
                field_selector=field_selector,
                metadata_only=metadata_only,
            )
            view = self._views[key] = NamespaceInformer(shared, self._view_client)
        return view

    def index_field(self, kind: Kind, name: str, extract: IndexFunc) -> None:
        """Index ``kind`` where the informers are: the host's (shared by every view) or the view's own."""
        self.source.index_field(kind, name, extract)

    def indexes(self, kind: Kind) -> list[str]:
        return self.source.indexes(kind)

    async def wait_for_sync(self, timeout: float | None = None) -> bool:
        if not self.shared:
            return await self.source.wait_for_sync(timeout)
        return all([await view.wait_for_sync(timeout) for view in list(self._views.values())])

    @property
    def has_synced(self) -> bool:
        if not self.shared:
            return self.source.has_synced
        return all(view.has_synced for view in self._views.values())

    async def _read(self, kind: Kind, namespace: str | None, metadata_only: bool) -> Informer:
        self._check(namespace)
        informer = self.informer(kind, metadata_only=metadata_only)
        return await synced(informer, self.cluster, self._timeout, self._view_client)

    async def get(
        self, kind: Kind, name: str, *, namespace: str | None = None, metadata_only: bool = False
    ) -> JSON:
        found = await self.get_or_none(kind, name, namespace=namespace, metadata_only=metadata_only)
        if found is None:
            raise not_found(self.cluster, kind, name, namespace or self._own)
        return found

    async def get_or_none(
        self, kind: Kind, name: str, *, namespace: str | None = None, metadata_only: bool = False
    ) -> JSON | None:
        """A copy of the namespace's object (or a cluster-scoped one), or ``None``."""
        informer = await self._read(kind, namespace, metadata_only)
        found = informer.get(f"{self._own}/{name}")
        if found is None:
            found = informer.get(name)  # a cluster-scoped kind's key has no namespace
        return json_copy(found) if found is not None else None

    async def _matching(
        self,
        kind: Kind,
        label_selector: str | Mapping[str, str] | None = None,
        index: tuple[str, str] | None = None,
        metadata_only: bool = False,
    ) -> list[JSON]:
        informer = await self._read(kind, None, metadata_only)
        if index is not None:
            candidates = [obj for obj in informer.store.by_index(*index) if _visible(obj, self._own)]
        else:
            candidates = [obj for obj in informer.list() if _visible(obj, self._own)]
        return copies(candidates, label_selector)

    async def list(self, kind: Kind, *, namespace: str | None = None, **selection: Any) -> list[JSON]:
        """Copies of the namespace's matching objects; a list costs what the namespace holds.

        ``selection`` is :meth:`Cache.list`'s: ``label_selector``, ``index``, ``metadata_only``.
        """
        self._check(namespace)
        return await self._matching(kind, **selection)
