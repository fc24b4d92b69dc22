"""A client for one API server: any kind, JSON-shaped objects, typed errors.

Kinds are resolved through :class:`Discovery`, so the client needs no generated
code and works for CRDs installed after it started. Reads return dicts; writes
take dicts or kubernetes-asyncio models. Every failure is one of the typed
errors in :mod:`mcruntime._base.errors`, naming the cluster and the object.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

import orjson

from .._base.errors import APIError, KindNotFound, NotFound, Unreachable, error_from_status
from .._base.kind import Kind, Resource
from .._base.objects import JSON, to_json_shape
from .answers import decode_answer, is_status, json_answer, list_page, next_page, watch_event
from .discovery import Discovery
from .field_validation import FieldValidation, checked_field_validation
from .permissions import refused_by_authorization, verb_of
from .server_warnings import ServerWarnings
from .transport import Transport
from .watching import MAX_WATCH_EVENT_BYTES as MAX_WATCH_EVENT_BYTES
from .watching import Lines, WatchRequest
from .watching import selector_text as _selector
from .wording import dropped

if TYPE_CHECKING:
    from .multiplex import WatchResponse

PatchType = Literal["merge", "json", "strategic"]
"""Which patch format ``Client.patch`` sends: JSON merge patch, JSON patch or strategic merge patch."""
_PATCH_CONTENT_TYPES: dict[str, str] = {
    "merge": "application/merge-patch+json",
    "json": "application/json-patch+json",
    "strategic": "application/strategic-merge-patch+json",
}
_APPLY = "application/apply-patch+yaml"  # JSON is valid YAML
# Metadata-only reads: the server answers with PartialObjectMetadata(List), no spec or data.
_METADATA_LIST = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"
_METADATA = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1"
# Answers the API server gives only after its authorizer allowed the request (the object or
# its namespace is missing, it changed, it is invalid): a refusal of the same request is over.
_AUTHORIZED = frozenset({404, 409, 410, 422})


class WatchEvent(NamedTuple):
    """One event of a watch: ADDED, MODIFIED, DELETED or BOOKMARK, and the object."""

    type: str
    object: JSON


@dataclass
class ObjectList:
    """A list result: the items and the resourceVersion to watch from."""

    items: list[JSON]
    resource_version: str
    kind: str = ""
    api_version: str = ""
    metadata: JSON = field(default_factory=dict)


class Client:
    """Reads and writes objects of any kind in one cluster.

    ``field_manager`` is the name every write carries unless the call names
    another: the API server records it in ``managedFields``, which is how a
    person (or server-side apply) tells which controller set a field. A
    :class:`~mcruntime.Manager` built with ``field_manager=`` gives it to the
    client of every cluster it engages. Every write also takes ``dry_run``:
    the server validates and admits the change (webhooks included) and answers
    with the result, but stores nothing.

    ``field_validation`` is sent with every write when set: ``"Strict"``
    makes a typo such as ``dat`` for ``data`` a :class:`BadRequest` naming
    the field, where the server's default (``"Warn"``) stores the object
    without it and only warns (logged once per cluster and text).
    """

    def __init__(
        self,
        transport: Transport,
        discovery: Discovery | None = None,
        *,
        field_manager: str | None = None,
        cluster: str | None = None,
        field_validation: FieldValidation | None = None,
    ) -> None:
        self.transport = transport
        self.discovery: Discovery = discovery or Discovery(transport)
        self.field_manager: str | None = field_manager
        self.field_validation: FieldValidation | None = checked_field_validation(field_validation)
        self._cluster = cluster
        self._warnings = ServerWarnings()

    @property
    def cluster(self) -> str:
        """The cluster name errors carry: ``cluster=``, else the transport's.

        ``cluster=`` names a view on another cluster's connection (a namespace of it).
        """
        return self._cluster or self.transport.cluster

    def __repr__(self) -> str:
        return f"<Client cluster={self.cluster!r}>"

    # --- plumbing ------------------------------------------------------------------

    async def resource(self, kind: Kind) -> Resource:
        """Discovery's answer for ``kind`` (cached)."""
        return await self.discovery.resource_for(kind)

    async def _call(
        self,
        method: str,
        resource: Resource,
        *,
        namespace: str | None = None,
        name: str | None = None,
        subresource: str | None = None,
        params: Mapping[str, str] | None = None,
        body: Any = None,
        content_type: str = "application/json",
        idempotent: bool | None = None,
        accept: str = "application/json",
    ) -> Any:
        if resource.namespaced and not namespace and name is not None:
            raise ValueError(f"{resource.kind} is namespaced: give a namespace for {name!r}")
        payload = None if body is None else orjson.dumps(body)
        status, headers, raw = await self.transport.request(
            method,
            resource.path(namespace, name, subresource),
            params=params,
            body=payload,
            content_type=content_type if payload is not None else None,
            idempotent=idempotent,
            accept=accept,
        )
        if status >= 300:  # what a refusal says goes into errors and logs: never the credential
            raw = self.transport.redact(raw)
        else:
            self._warnings.note(self.cluster, headers, method, resource.kind, namespace, name, body)
        decoded = decode_answer(raw)
        self._note_permission(status, decoded, verb_of(method, name), resource, namespace, subresource)
        if status < 300:
            json_answer(decoded, self.cluster, resource.kind, f"{method} {resource.plural}")
        else:
            if status == 404 and subresource is not None and subresource not in resource.subresources:
                # As NotFound it would read as "the object is gone" to a reconciler's except NotFound.
                raise APIError(
                    f"{resource.kind} ({resource.api_version}) has no {subresource!r} subresource; "
                    f"write its {subresource} with update() or patch()",
                    cluster=self.cluster,
                    status=status,
                    reason="NoSuchSubresource",
                    kind=resource.kind,
                    namespace=namespace,
                    name=name,
                )
            if status == 404 and not is_status(decoded):
                raise self._unserved(resource)
            retry_after = headers.get("Retry-After")
            raise error_from_status(
                status,
                decoded,
                cluster=self.cluster,
                kind=resource.kind,
                namespace=namespace,
                name=name,
                retry_after=float(retry_after) if retry_after and retry_after.isdigit() else None,
            )
        return decoded

    def _note_permission(
        self,
        status: int,
        body: Any,
        verb: str,
        resource: Resource,
        namespace: str | None,
        subresource: str | None,
    ) -> None:
        denials = self.transport.health.denials
        if status == 403:
            if refused_by_authorization(body):  # not an admission plugin's or a webhook's 403
                denials.denied(verb, resource, namespace, subresource=subresource)
        elif status < 300 or status in _AUTHORIZED:
            denials.allowed(verb, resource, namespace, subresource=subresource)

    async def _target(self, obj: Any, namespace: str | None) -> tuple[JSON, Resource, str | None, str | None]:
        body = to_json_shape(obj)
        if not isinstance(body, dict):
            raise TypeError("an object to write must be a mapping or a model")
        kind = Kind.of(body)
        resource = await self.resource(kind)
        meta = body.get("metadata") or {}
        target_namespace = namespace or meta.get("namespace")
        if resource.namespaced and not target_namespace:
            raise ValueError(f"{kind} is namespaced: the object has no metadata.namespace")
        return body, resource, (target_namespace if resource.namespaced else None), meta.get("name")

    # --- reads -------------------------------------------------------------------------

    async def get(self, kind: Kind, name: str, *, namespace: str | None = None) -> JSON:
        """One object; raises :class:`NotFound` when it does not exist."""
        resource = await self.resource(kind)
        result: JSON = await self._call("GET", resource, namespace=namespace, name=name)
        return result

    async def get_or_none(self, kind: Kind, name: str, *, namespace: str | None = None) -> JSON | None:
        """One object, or ``None`` when it does not exist (every other failure still raises)."""
        try:
            return await self.get(kind, name, namespace=namespace)
        except NotFound:
            return None

    async def list_pages(
        self,
        kind: Kind,
        *,
        namespace: str | None = None,
        label_selector: str | Mapping[str, str] | None = None,
        field_selector: str | None = None,
        page_size: int | None = 500,
        metadata_only: bool = False,
    ) -> AsyncIterator[ObjectList]:
        """Pages of a list, following ``continue`` tokens; all from one snapshot.

        ``metadata_only`` asks the server for ``PartialObjectMetadata``: each item
        is then ``apiVersion``, ``kind`` (of ``kind``) and ``metadata`` only.
        """
        resource = await self.resource(kind)
        params: dict[str, str] = {}
        if (selector := _selector(label_selector)) is not None:
            params["labelSelector"] = selector
        if field_selector:
            params["fieldSelector"] = field_selector
        if page_size:
            params["limit"] = str(page_size)
        token: str | None = None
        pages = 0
        while True:
            page = await self._call(
                "GET",
                resource,
                namespace=namespace,
                params=params,
                accept=_METADATA_LIST if metadata_only else "application/json",
            )
            meta, items = list_page(page, self.cluster, resource.kind)
            item_kind = resource.kind
            for item in items:
                # Items omit apiVersion and kind (metadata ones say PartialObjectMetadata): put ours.
                if metadata_only:
                    item["apiVersion"], item["kind"] = resource.api_version, item_kind
                item.setdefault("apiVersion", resource.api_version)
                item.setdefault("kind", item_kind)
            yield ObjectList(
                items=items,
                resource_version=str(meta.get("resourceVersion", "")),
                kind=str(page.get("kind", "")),
                api_version=str(page.get("apiVersion", "")),
                metadata=meta,
            )
            pages += 1
            token = next_page(meta.get("continue"), token, pages, self.cluster, resource.kind)
            if token is None:
                return
            params["continue"] = token

    async def list(
        self,
        kind: Kind,
        *,
        namespace: str | None = None,
        label_selector: str | Mapping[str, str] | None = None,
        field_selector: str | None = None,
        page_size: int | None = 500,
        metadata_only: bool = False,
    ) -> ObjectList:
        """Every matching object (paged under the hood) and the list's resourceVersion."""
        items: list[JSON] = []
        last: ObjectList | None = None
        async for page in self.list_pages(
            kind,
            namespace=namespace,
            label_selector=label_selector,
            field_selector=field_selector,
            page_size=page_size,
            metadata_only=metadata_only,
        ):
            items.extend(page.items)
            last = page
        assert last is not None
        return ObjectList(items, last.resource_version, last.kind, last.api_version, last.metadata)

    async def watch(
        self,
        kind: Kind,
        *,
        namespace: str | None = None,
        resource_version: str | None = None,
        label_selector: str | Mapping[str, str] | None = None,
        field_selector: str | None = None,
        allow_bookmarks: bool = True,
        timeout_seconds: int | None = None,
        read_timeout: float | None = 90.0,
        metadata_only: bool = False,
    ) -> AsyncIterator[WatchEvent]:
        """Events from ``resource_version`` on, until the server ends the stream.

        ``metadata_only`` streams ``PartialObjectMetadata`` objects, relabelled
        with ``kind``'s apiVersion and kind as :meth:`list_pages` does.

        An ERROR event raises its typed error (:class:`Gone` for an expired
        resourceVersion); a connection silent for ``read_timeout`` seconds raises
        :class:`Unreachable`. Reconnecting is the caller's decision (the informer
        makes it).
        """
        request = WatchRequest(
            kind, namespace, resource_version, label_selector, field_selector,
            allow_bookmarks, timeout_seconds, read_timeout, metadata_only,
        )  # fmt: skip
        async with self._watch_stream(request) as (response, resource):
            lines = Lines(resource, self.cluster)
            health = self.transport.health
            async for chunk in response.content.iter_any():
                health.alive()  # events and bookmarks prove the server answers: no probe needed
                for line in lines.feed(chunk):
                    yield self._event(line, resource, metadata_only)
            if (last := lines.rest()) is not None:
                yield self._event(last, resource, metadata_only)

    async def _watch_each(
        self,
        request: WatchRequest,
        handle: Callable[[WatchEvent], None],
        opened: Callable[[], None] | None = None,
    ) -> None:
        """:meth:`watch`, with each event handed to ``handle`` as it is read: the informer's path.

        On an HTTP/2 stream the events are handled inside the connection's read,
        without waking a task per event. An exception from ``handle`` ends the
        watch and is raised here. ``opened`` is called once the server has
        accepted the watch: a quiet cluster sends no event for a minute, and
        an informer that had been failing is working again from that moment.
        A subclass that overrides :meth:`watch` and not this method (a user's
        wrapper) is served through its own :meth:`watch`; the namespaced view
        overrides both.
        """
        metadata_only = request.metadata_only
        if type(self).watch is not Client.watch:
            async for event in self.watch(request.kind, **request.options()):
                handle(event)
            return
        async with self._watch_stream(request) as (response, resource):
            if opened is not None:
                opened()
            lines = Lines(resource, self.cluster)
            health = self.transport.health
            decode = self._event

            def take(chunk: bytes) -> None:
                health.alive()
                for line in lines.feed(chunk):
                    handle(decode(line, resource, metadata_only))

            content = response.content
            deliver = getattr(content, "deliver", None)  # an HTTP/2 stream (multiplex.Stream)
            if deliver is not None:
                await deliver(take)
            else:
                async for chunk in content.iter_any():
                    take(chunk)
            if (last := lines.rest()) is not None:
                handle(decode(last, resource, metadata_only))

    def _unserved(self, resource: Resource) -> KindNotFound:
        """The mux's 404 (version unserved, CRD deleted): as NotFound, a live object would read as gone."""
        self.discovery.stale(Kind(resource.api_version, resource.kind))
        return KindNotFound(self.cluster, resource.api_version, resource.kind)

    @asynccontextmanager
    async def _watch_stream(self, request: WatchRequest) -> AsyncIterator[tuple[WatchResponse, Resource]]:
        """The watch's response, status checked; a silent or dropped stream raises :class:`Unreachable`."""
        resource = await self.resource(request.kind)
        path = resource.path(request.namespace)
        read_timeout = request.read_timeout
        try:
            accept = _METADATA if request.metadata_only else "application/json"
            async with self.transport.stream(
                path, params=request.params(), read_timeout=read_timeout, accept=accept
            ) as response:
                body = (
                    decode_answer(self.transport.redact(await response.read()))
                    if response.status >= 300
                    else None
                )
                self._note_permission(response.status, body, "watch", resource, request.namespace, None)
                if response.status == 404 and not is_status(body):
                    raise self._unserved(resource)  # the informer's warning names the apiVersion
                if response.status >= 300:
                    raise error_from_status(response.status, body, cluster=self.cluster, kind=resource.kind)
                yield response, resource
        except TimeoutError:  # before the dropped connections: aiohttp's read timeout is both
            self.transport.health.failure(f"watch of {resource.kind} silent for {read_timeout}s")
            raise Unreachable(
                f"watch of {resource.plural} silent for {read_timeout}s", cluster=self.cluster
            ) from None
        except Exception as error:
            if not dropped(error):  # dropped, reset, or closed by the circuit; else not ours to word
                raise
            health = self.transport.health
            if health.unreachable:
                message = f"watch of {resource.plural} closed: {health.reason}"
                raise Unreachable(message, cluster=self.cluster) from None
            # What the server did (a reset's code, a protocol violation), not only the error's class.
            said = (str(error) or type(error).__name__)[:300]
            health.failure(f"watch of {resource.kind} interrupted: {said}")
            message = f"watch of {resource.plural} interrupted: {said}"
            raise Unreachable(message, cluster=self.cluster) from None

    def _event(self, line: bytes, resource: Resource, metadata_only: bool = False) -> WatchEvent:
        kind, obj = watch_event(line, self.cluster, resource.kind)
        if kind == "ERROR":
            status = orjson.loads(self.transport.redact(orjson.dumps(obj)))  # never quote the credential
            code = int(status.get("code") or 500) if isinstance(status, dict) else 500
            raise error_from_status(code, status, cluster=self.cluster, kind=resource.kind)
        if metadata_only and kind != "BOOKMARK":
            obj["apiVersion"], obj["kind"] = resource.api_version, resource.kind
        return WatchEvent(kind, obj)

    # --- writes -------------------------------------------------------------------------

    def _write_params(self, field_manager: str | None, dry_run: bool) -> dict[str, str] | None:
        params: dict[str, str] = {}
        manager = field_manager or self.field_manager
        if manager:
            params["fieldManager"] = manager
        if dry_run:
            params["dryRun"] = "All"
        if self.field_validation is not None:
            params["fieldValidation"] = self.field_validation
        return params or None

    async def create(
        self,
        obj: Any,
        *,
        namespace: str | None = None,
        field_manager: str | None = None,
        dry_run: bool = False,
    ) -> JSON:
        """Create ``obj``; raises :class:`AlreadyExists` when its name is taken."""
        body, resource, target_namespace, _name = await self._target(obj, namespace)
        params = self._write_params(field_manager, dry_run)
        result: JSON = await self._call(
            "POST", resource, namespace=target_namespace, params=params, body=body
        )
        return result

    async def update(self, obj: Any, *, field_manager: str | None = None, dry_run: bool = False) -> JSON:
        """Replace ``obj`` (optimistic concurrency: a stale resourceVersion is a :class:`Conflict`)."""
        return await self._replace(obj, None, field_manager, dry_run)

    async def update_status(
        self, obj: Any, *, field_manager: str | None = None, dry_run: bool = False
    ) -> JSON:
        """Replace the status subresource of ``obj``."""
        return await self._replace(obj, "status", field_manager, dry_run)

    async def _replace(
        self, obj: Any, subresource: str | None, field_manager: str | None, dry_run: bool
    ) -> JSON:
        body, resource, namespace, name = await self._target(obj, None)
        if not name:
            raise ValueError(f"{resource.kind}: an update needs metadata.name")
        params = self._write_params(field_manager, dry_run)
        result: JSON = await self._call(
            "PUT", resource, namespace=namespace, name=name, subresource=subresource, params=params, body=body
        )
        return result

    async def patch(
        self,
        kind: Kind,
        name: str,
        patch: Any,
        *,
        namespace: str | None = None,
        patch_type: PatchType = "merge",
        subresource: str | None = None,
        field_manager: str | None = None,
        dry_run: bool = False,
    ) -> JSON:
        """Patch one object: merge (RFC 7386), JSON (RFC 6902) or strategic merge.

        Strategic merge is for built-in kinds only; the server rejects it for
        custom resources (a :class:`BadRequest` or 415 error). A merge patch that
        carries ``metadata.resourceVersion`` is refused with :class:`Conflict`
        when the object changed since that version: optimistic concurrency for
        patches (``mcruntime.toolkit``'s finalizer helpers rely on it).
        """
        resource = await self.resource(kind)
        params = self._write_params(field_manager, dry_run)
        result: JSON = await self._call(
            "PATCH",
            resource,
            namespace=namespace,
            name=name,
            subresource=subresource,
            params=params,
            body=to_json_shape(patch),
            content_type=_PATCH_CONTENT_TYPES[patch_type],
            idempotent=patch_type == "merge",
        )
        return result

    async def apply(
        self,
        obj: Any,
        *,
        field_manager: str | None = None,
        force: bool = False,
        subresource: str | None = None,
        dry_run: bool = False,
    ) -> JSON:
        """Server-side apply: declare the fields this manager owns.

        Applying the same manifest twice changes nothing; a field owned by another
        manager is a :class:`Conflict` unless ``force`` takes it over. Apply
        needs a field manager: ``field_manager`` or the client's default.
        """
        body, resource, namespace, name = await self._target(obj, None)
        if not name:
            raise ValueError(f"{resource.kind}: apply needs metadata.name")
        params = self._write_params(field_manager, dry_run) or {}
        if "fieldManager" not in params:
            raise ValueError(
                f"{resource.kind} {name!r}: apply needs a field manager (pass field_manager= "
                "or build the Manager with field_manager=)"
            )
        if force:
            params["force"] = "true"
        result: JSON = await self._call(
            "PATCH",
            resource,
            namespace=namespace,
            name=name,
            subresource=subresource,
            params=params,
            body=body,
            content_type=_APPLY,
            idempotent=True,
        )
        return result

    async def delete(
        self,
        kind: Kind,
        name: str,
        *,
        namespace: str | None = None,
        propagation_policy: Literal["Foreground", "Background", "Orphan"] | None = None,
        uid: str | None = None,
        resource_version: str | None = None,
        grace_period_seconds: int | None = None,
        dry_run: bool = False,
    ) -> JSON | None:
        """Delete one object, optionally only if its uid / resourceVersion still match.

        Returns the object as the server last saw it (with a deletionTimestamp
        when finalizers hold it), or ``None`` when the server returned a Status.
        """
        resource = await self.resource(kind)
        options: JSON = {"apiVersion": "v1", "kind": "DeleteOptions"}
        if propagation_policy:
            options["propagationPolicy"] = propagation_policy
        preconditions = {
            key: value for key, value in (("uid", uid), ("resourceVersion", resource_version)) if value
        }
        if preconditions:
            options["preconditions"] = preconditions
        if grace_period_seconds is not None:
            options["gracePeriodSeconds"] = grace_period_seconds
        if dry_run:  # in the body: the server ignores query parameters when DeleteOptions come in it
            options["dryRun"] = ["All"]
        result = await self._call("DELETE", resource, namespace=namespace, name=name, body=options)
        if is_status(result):
            return None
        return result if isinstance(result, dict) else None
