"""The client of a namespace view: a host connection's reads and writes, pinned to one namespace.

:class:`NamespacedClient` holds a :class:`~mcruntime.Client` of the host's
connection (its transport and discovery, under the view's name) and reaches
it through the :class:`~mcruntime._client.protocols.Reader` and
:class:`~mcruntime._client.protocols.Writer` methods only: every call is pinned
here, then delegated. Nothing of :class:`Client`'s request building is
overridden, so a change in it cannot route around the pin.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

from .._base.errors import Forbidden
from .._base.kind import Kind, Resource
from .._base.objects import JSON, metadata, to_json_shape
from .._client.client import Client, ObjectList, WatchEvent
from .._client.protocols import Reader, Writer
from .._client.watching import WatchRequest


def refused(cluster: str, namespace: str, kind: str, wanted: str | None, name: str | None) -> Forbidden:
    """The error of a view asked for another namespace (``wanted``) or to write a cluster-scoped kind."""
    if wanted:
        why = f"namespace {wanted!r} is outside it"
    else:
        why = "the kind is cluster-scoped: shared by every namespace of the host, so read-only here"
    return Forbidden(
        f"refused before sending: cluster {cluster!r} is namespace {namespace!r} only, and {why}",
        cluster=cluster,
        status=403,
        reason="Forbidden",
        kind=kind,
        namespace=wanted,
        name=name,
    )


class NamespacedClient(Client):
    """The host's connection as one namespace's client (see :class:`~mcruntime.NamespacedCluster`).

    A :class:`Client` by type, so it goes wherever a cluster's client goes;
    by construction, a wrapper: every public method is defined here, pins the
    namespace and delegates to a plain client of the host's connection. (A
    test checks that no public method of :class:`Client` is left inherited.)
    ``field_manager`` is the view's own: the manager may set it.
    """

    def __init__(self, host: Client, namespace: str, cluster: str) -> None:
        super().__init__(host.transport, host.discovery, field_manager=host.field_manager, cluster=cluster)
        self.namespace = namespace
        self._host = Client(host.transport, host.discovery, cluster=cluster)
        self._reads: Reader[ObjectList] = self._host
        self._writes: Writer = self._host

    def __repr__(self) -> str:
        return f"<Client cluster={self.cluster!r} namespace={self.namespace!r}>"

    def _pin(self, resource: Resource, namespace: str | None, name: str | None, *, write: bool) -> str | None:
        """The namespace a call goes to: the view's for a namespaced kind, none for a cluster-scoped one."""
        if resource.namespaced:
            if namespace in (None, "", self.namespace):
                return self.namespace
            raise refused(self.cluster, self.namespace, resource.kind, namespace, name)
        if write:
            raise refused(self.cluster, self.namespace, resource.kind, None, name)
        return None

    async def _pinned(
        self, kind: Kind, namespace: str | None, name: str | None, *, write: bool
    ) -> str | None:
        return self._pin(await self.resource(kind), namespace, name, write=write)

    async def _placed(self, obj: Any, namespace: str | None = None) -> tuple[JSON, str | None]:
        """A copy of ``obj`` in the view's namespace (set when it names none), and that namespace."""
        body = to_json_shape(obj)  # a copy: the caller's object is never changed
        if not isinstance(body, dict):
            raise TypeError("an object to write must be a mapping or a model")
        meta = metadata(body)
        pinned = await self._pinned(
            Kind.of(body), namespace or meta.get("namespace"), meta.get("name"), write=True
        )
        if pinned is not None:
            body["metadata"] = {**meta, "namespace": pinned}
        return body, pinned

    async def resource(self, kind: Kind) -> Resource:
        """Discovery's answer for ``kind``: the host's discovery, shared by every view."""
        return await self._host.resource(kind)

    # --- reads: the view's namespace, or a cluster-scoped kind whole ---------------------

    async def get(self, kind: Kind, name: str, *, namespace: str | None = None) -> JSON:
        pinned = await self._pinned(kind, namespace, name, write=False)
        return await self._reads.get(kind, name, namespace=pinned)

    async def get_or_none(self, kind: Kind, name: str, *, namespace: str | None = None) -> JSON | None:
        pinned = await self._pinned(kind, namespace, name, write=False)
        return await self._reads.get_or_none(kind, name, namespace=pinned)

    async def list(self, kind: Kind, *, namespace: str | None = None, **options: Any) -> ObjectList:
        pinned = await self._pinned(kind, namespace, None, write=False)
        return await self._reads.list(kind, namespace=pinned, **options)

    async def list_pages(
        self, kind: Kind, *, namespace: str | None = None, **options: Any
    ) -> AsyncIterator[ObjectList]:
        pinned = await self._pinned(kind, namespace, None, write=False)
        async for page in self._host.list_pages(kind, namespace=pinned, **options):
            yield page

    async def watch(
        self, kind: Kind, *, namespace: str | None = None, **options: Any
    ) -> AsyncIterator[WatchEvent]:
        """Events of the namespace (or of a cluster-scoped kind); another namespace is refused."""
        pinned = await self._pinned(kind, namespace, None, write=False)
        async for event in self._host.watch(kind, namespace=pinned, **options):
            yield event

    async def _watch_each(
        self,
        request: WatchRequest,
        handle: Callable[[WatchEvent], None],
        opened: Callable[[], None] | None = None,
    ) -> None:
        """The informer's path, pinned as :meth:`watch` is."""
        pinned = await self._pinned(request.kind, request.namespace, None, write=False)
        await self._host._watch_each(request._replace(namespace=pinned), handle, opened)

    # --- writes: the view's namespace only; cluster-scoped kinds are refused --------------

    def _manager(self, field_manager: str | None) -> str | None:
        return field_manager or self.field_manager

    async def create(
        self, obj: Any, *, namespace: str | None = None, field_manager: str | None = None, **options: Any
    ) -> JSON:
        body, pinned = await self._placed(obj, namespace)
        return await self._writes.create(
            body, namespace=pinned, field_manager=self._manager(field_manager), **options
        )

    async def update(self, obj: Any, *, field_manager: str | None = None, dry_run: bool = False) -> JSON:
        body, _pinned = await self._placed(obj)
        return await self._writes.update(body, field_manager=self._manager(field_manager), dry_run=dry_run)

    async def update_status(
        self, obj: Any, *, field_manager: str | None = None, dry_run: bool = False
    ) -> JSON:
        body, _pinned = await self._placed(obj)
        return await self._writes.update_status(
            body, field_manager=self._manager(field_manager), dry_run=dry_run
        )

    async def patch(
        self, kind: Kind, name: str, patch: Any, *, namespace: str | None = None, **options: Any
    ) -> JSON:
        pinned = await self._pinned(kind, namespace, name, write=True)
        manager = self._manager(options.pop("field_manager", None))
        return await self._writes.patch(kind, name, patch, namespace=pinned, field_manager=manager, **options)

    async def apply(self, obj: Any, *, field_manager: str | None = None, **options: Any) -> JSON:
        body, _pinned = await self._placed(obj)
        return await self._writes.apply(body, field_manager=self._manager(field_manager), **options)

    async def delete(
        self, kind: Kind, name: str, *, namespace: str | None = None, **options: Any
    ) -> JSON | None:
        pinned = await self._pinned(kind, namespace, name, write=True)
        return await self._writes.delete(kind, name, namespace=pinned, **options)
