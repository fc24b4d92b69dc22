"""Informers: a local, always-converging copy of one kind's objects, with events.

The loop is ours rather than kubernetes-asyncio's ``Watch``: list, then watch
from the list's resourceVersion with bookmarks; when the server says 410 Gone,
list again and emit the *difference* as add/update/delete events, so handlers
never miss a deletion that happened while the watch was down. A client-side read
timeout notices a silent connection; reconnects back off with jitter. After any
outage the store converges to what a fresh list returns.

One informer may cover several namespaces (a scoped cache): it runs one
list-and-watch per namespace into one store, each with its own resourceVersion,
and counts as synced once every namespace has listed. A metadata-only informer
asks the server for ``PartialObjectMetadata`` and stores names, labels,
annotations and owners without spec, status or data.

Handlers are plain callables run in the informer's task between store updates:
they must be quick (enqueue a key, no I/O), and may be added or removed at any
time; a handler added late is first told about every object already stored.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from .._base.backoff import Backoff
from .._base.errors import Forbidden, Gone, KindNotFound, NotFound, Unauthorized, Unreachable
from .._base.kind import Kind
from .._base.labels import LabelSelector
from .._base.objects import JSON, metadata, object_key
from .._client.client import Client, WatchEvent
from .._client.health import HealthState
from .._client.watching import WatchRequest
from .presence import KindPresence

log = logging.getLogger("mcruntime.informer")

_PERSISTENT_AFTER = 3
"""Failures in a row after which a list or watch that keeps failing is a warning, not a blip."""

Transform = Callable[[JSON], JSON]
IndexFunc = Callable[[JSON], Iterable[str]]
"""The values an object is indexed under: a field index answers ``by_index(name, value)`` without a scan."""


def strip_managed_fields(obj: JSON) -> JSON:
    """The default transform: drop ``metadata.managedFields`` (often half an object's size)."""
    meta = obj.get("metadata")
    if isinstance(meta, dict):
        meta.pop("managedFields", None)
    return obj


@dataclass
class ResourceEventHandler:
    """Callbacks for one consumer; any may be ``None``.

    ``on_add(obj, is_initial_list)`` — ``is_initial_list`` is true for objects
    delivered by a list (start, relist, or replay to a late handler), false for
    live watch events. ``on_update(old, new)``; ``on_delete(last_known)``.
    """

    on_add: Callable[[JSON, bool], None] | None = None
    on_update: Callable[[JSON, JSON], None] | None = None
    on_delete: Callable[[JSON], None] | None = None


class HandlerRegistration:
    """Returned by :meth:`Informer.add_handler`; ``remove()`` detaches the handler."""

    def __init__(self, informer: Informer, handler: ResourceEventHandler) -> None:
        self._informer = informer
        self.handler = handler

    def remove(self) -> None:
        self._informer.remove_handler(self)

    @property
    def has_synced(self) -> bool:
        return self._informer.has_synced


@dataclass
class InformerStats:
    """Counters for metrics and tests: how often the informer listed and re-watched."""

    lists: int = 0
    relists: int = 0
    """Lists after the first of each namespace (an informer of several lists once per namespace)."""
    relists_after_gone: int = 0
    watch_restarts: int = 0
    events: int = 0
    last_error: str | None = None
    sync_seconds: float | None = None


class Store:
    """Objects by ``namespace/name`` plus any number of field indexes."""

    def __init__(self) -> None:
        self.objects: dict[str, JSON] = {}
        self._index_funcs: dict[str, IndexFunc] = {}
        self._indexes: dict[str, dict[str, set[str]]] = {}
        self._indexed_values: dict[str, dict[str, tuple[str, ...]]] = {}

    def add_index(self, name: str, extract: IndexFunc) -> None:
        """Add (or replace) an index and build it over the objects already stored."""
        self._index_funcs[name] = extract
        self._indexes[name] = {}
        self._indexed_values[name] = {}
        for key, obj in self.objects.items():
            self._index_one(name, key, obj)

    def has_index(self, name: str) -> bool:
        return name in self._index_funcs

    def _index_one(self, name: str, key: str, obj: JSON | None) -> None:
        index = self._indexes[name]
        for value in self._indexed_values[name].pop(key, ()):
            keys = index.get(value)
            if keys is not None:
                keys.discard(key)
                if not keys:
                    del index[value]
        if obj is None:
            return
        try:
            values = tuple(dict.fromkeys(self._index_funcs[name](obj)))
        except Exception:
            log.exception("index %r failed on %s", name, key)
            values = ()
        if values:
            self._indexed_values[name][key] = values
            for value in values:
                index.setdefault(value, set()).add(key)

    def put(self, key: str, obj: JSON) -> JSON | None:
        old = self.objects.get(key)
        self.objects[key] = obj
        for name in self._index_funcs:
            self._index_one(name, key, obj)
        return old

    def pop(self, key: str) -> JSON | None:
        old = self.objects.pop(key, None)
        if old is not None:
            for name in self._index_funcs:
                self._index_one(name, key, None)
        return old

    def by_index(self, name: str, value: str) -> list[JSON]:
        if name not in self._indexes:
            raise KeyError(f"no index named {name!r}")
        return [self.objects[key] for key in self._indexes[name].get(value, ())]


class Informer:
    """Lists and watches one kind (optionally some namespaces and selectors) into a :class:`Store`.

    ``namespace`` (one) or ``namespaces`` (several) limit a namespaced kind;
    they are ignored for cluster-scoped kinds. ``metadata_only`` stores
    ``PartialObjectMetadata``: ``apiVersion``, ``kind`` and ``metadata`` only.
    """

    def __init__(
        self,
        client: Client,
        kind: Kind,
        *,
        namespace: str | None = None,
        namespaces: Iterable[str] | None = None,
        metadata_only: bool = False,
        label_selector: str | Mapping[str, str] | None = None,
        field_selector: str | None = None,
        transform: Transform | None = strip_managed_fields,
        resync_period: float | None = None,
        read_timeout: float = 90.0,
        page_size: int = 500,
        max_backoff: float = 30.0,
        backoff: Backoff | None = None,
    ) -> None:
        if namespace is not None and namespaces is not None:
            raise ValueError("give an informer namespace or namespaces, not both")
        if isinstance(namespaces, str):
            raise TypeError(f"namespaces is a list of names, not the string {namespaces!r}")
        self.client = client
        self.kind = kind
        self.namespaces: tuple[str, ...] | None = (
            (namespace,) if namespace else tuple(sorted(set(namespaces))) if namespaces else None
        )
        self.metadata_only = metadata_only
        self.label_selector: LabelSelector = LabelSelector.parse(label_selector)
        self.field_selector = field_selector
        self.store: Store = Store()
        self.stats: InformerStats = InformerStats()
        self._versions: dict[str | None, str] = {}
        self._listed: set[str | None] = set()
        self._streams: tuple[str | None, ...] | None = None
        self._transform = transform
        self._resync_period = resync_period
        self._read_timeout = read_timeout
        self._page_size = page_size
        self._backoff = backoff or Backoff(cap=max_backoff)
        self._handlers: list[HandlerRegistration] = []
        self._synced = asyncio.Event()
        self._created = time.monotonic()
        # Per list-and-watch (one per namespace of a scoped informer): what fails it, and the kind
        # of failure already logged at WARNING. One namespace's events do not clear another's.
        self._failing: dict[str | None, Exception] = {}
        self._warned: dict[str | None, type[Exception]] = {}
        self.presence: KindPresence = KindPresence()
        """Who accepts the kind's absence from this cluster, and whether it is absent now."""

    def __repr__(self) -> str:
        scope = f" namespaces={','.join(self.namespaces)}" if self.namespaces else ""
        selector = f" selector={self.label_selector}" if not self.label_selector.empty else ""
        fields = f" fields={self.field_selector}" if self.field_selector else ""
        lean = " metadata-only" if self.metadata_only else ""
        return f"<Informer {self.kind} cluster={self.client.cluster!r}{scope}{selector}{fields}{lean}>"

    @property
    def namespace(self) -> str | None:
        """The namespace when the informer covers exactly one, else ``None``."""
        return self.namespaces[0] if self.namespaces and len(self.namespaces) == 1 else None

    @property
    def resource_version(self) -> str:
        """Where the watch stands; per namespace when there are several (then ``""`` here)."""
        if len(self._versions) == 1:
            return next(iter(self._versions.values()))
        return ""

    # --- consumers ------------------------------------------------------------------

    @property
    def has_synced(self) -> bool:
        return self._synced.is_set()

    @property
    def failing(self) -> Exception | None:
        """Why every list and watch fails, once that is no passing blip; ``None`` while it works.

        After its first sync an informer's store is trusted as current; while
        this is set it is not: the store keeps what it last heard, and nothing
        new arrives. A kind deleted from the server (its CRD uninstalled: a
        404 for the collection) is set at once; any other failure (a server
        answering 500, a selector it rejects, a refusal) after three in a
        row, so a dropped watch does not flap it. Each is retried with
        backoff for as long as it lasts; this says so to whoever reports
        health (``/readyz``, a provider's hub entry, the
        ``mcruntime_informer_failing`` gauge). Cleared by a list that
        succeeds or a watch event, bookmarks included.
        """
        return next(iter(self._failing.values()), None)

    @property
    def broken(self) -> Exception | None:
        """:attr:`failing`, except a kind missing where every source holding it said it may be.

        What health counts (``/readyz``, ``statuses()``, the failing gauge): a
        CRD a fleet installs on some members only is no trouble where it is not.
        """
        error = self.failing
        if isinstance(error, KindNotFound) and self.presence.may_be_absent:
            return None
        return error

    async def wait_for_sync_or_absence(self, timeout: float | None = None) -> bool:
        """Wait until synced, or until the cluster is found to serve no such kind; ``False`` on timeout."""
        waits = [asyncio.ensure_future(event.wait()) for event in (self._synced, self.presence.absent)]
        try:
            _done, pending = await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for wait in waits:
                wait.cancel()
        return len(pending) < len(waits)

    async def wait_for_sync(self, timeout: float | None = None) -> bool:
        """Wait until the first list is in the store; ``False`` if ``timeout`` passed first."""
        try:
            async with asyncio.timeout(timeout):
                await self._synced.wait()
        except TimeoutError:
            return False
        return True

    def add_handler(self, handler: ResourceEventHandler) -> HandlerRegistration:
        """Attach a handler; if the store is already filled, replay it as initial adds."""
        registration = HandlerRegistration(self, handler)
        self._handlers.append(registration)
        if handler.on_add is not None:
            for obj in list(self.store.objects.values()):
                self._call(handler.on_add, obj, True)
        return registration

    def remove_handler(self, registration: HandlerRegistration) -> None:
        if registration in self._handlers:
            self._handlers.remove(registration)

    @property
    def handler_count(self) -> int:
        return len(self._handlers)

    def add_index(self, name: str, extract: IndexFunc) -> None:
        self.store.add_index(name, extract)

    def list(self, namespace: str | None = None) -> list[JSON]:
        """Stored objects (no copies: the cache's reader copies for its callers)."""
        if namespace is None:
            return list(self.store.objects.values())
        prefix = f"{namespace}/"
        return [obj for key, obj in self.store.objects.items() if key.startswith(prefix)]

    def get(self, key: str) -> JSON | None:
        return self.store.objects.get(key)

    def view(self) -> Mapping[str, JSON]:
        """A read-only, live view of the objects held now, by ``namespace/name`` key.

        What a provider's pass reads: the whole store at once, without copying
        it and without reaching into the store, which stays the informer's.
        The view follows the store; take ``dict(view)`` to keep a snapshot.
        """
        return MappingProxyType(self.store.objects)

    # --- dispatch -------------------------------------------------------------------

    def _call(self, callback: Callable[..., None], *args: Any) -> None:
        try:
            callback(*args)
        except Exception:
            log.exception("%r: an event handler failed", self)

    def _emit_add(self, obj: JSON, initial: bool) -> None:
        for registration in list(self._handlers):
            if registration.handler.on_add is not None:
                self._call(registration.handler.on_add, obj, initial)

    def _emit_update(self, old: JSON, new: JSON) -> None:
        for registration in list(self._handlers):
            if registration.handler.on_update is not None:
                self._call(registration.handler.on_update, old, new)

    def _emit_delete(self, obj: JSON) -> None:
        for registration in list(self._handlers):
            if registration.handler.on_delete is not None:
                self._call(registration.handler.on_delete, obj)

    def _prepare(self, obj: JSON) -> JSON:
        obj.setdefault("apiVersion", self.kind.api_version)
        obj.setdefault("kind", self.kind.kind)
        return self._transform(obj) if self._transform is not None else obj

    # --- the loop -------------------------------------------------------------------

    async def run(self) -> None:
        """List and watch until cancelled; never raises for server or network trouble."""
        resync = None
        if self._resync_period:
            resync = asyncio.create_task(self._resync_loop(self._resync_period))
        try:
            streams = await self._resolve_streams()
            if len(streams) == 1:
                await self._list_and_watch(streams[0])
            else:
                async with asyncio.TaskGroup() as group:
                    for scope in streams:
                        group.create_task(self._list_and_watch(scope), name=f"{self!r} {scope}")
        finally:
            if resync is not None:
                resync.cancel()
                await asyncio.gather(resync, return_exceptions=True)

    async def _resolve_streams(self) -> tuple[str | None, ...]:
        """One list-and-watch per namespace; one in all for a cluster-scoped kind.

        Several namespaces need to know whether the kind is namespaced at all,
        which discovery says (retried with backoff until it answers: the kind
        may be a CRD not installed yet).
        """
        if self._streams is not None:
            return self._streams
        if not self.namespaces or len(self.namespaces) == 1:
            self._streams = (self.namespace,)
            return self._streams
        failures = 0
        while True:
            try:
                resource = await self.client.resource(self.kind)
                break
            except Exception as error:
                self.stats.last_error = str(error)
                log.info("%r: %s; retrying discovery with backoff", self, error)
                await self._backoff.sleep(failures, wake=self.client.transport.health.recovery())
                failures += 1
        self._streams = tuple(self.namespaces) if resource.namespaced else (None,)
        return self._streams

    async def _list_and_watch(self, scope: str | None) -> None:
        failures = 0
        gone_streak = 0
        health = self.client.transport.health
        # A resumed informer continues from its last resourceVersion; the server
        # says 410 if that history is gone, and then the relist emits the difference.
        need_list = not (scope in self._listed and self._versions.get(scope))
        while True:
            try:
                if need_list:
                    await self._relist(scope)
                    need_list = False
                    failures = 0
                    gone_streak = 0
                    self._working(scope)
                await self._watch(scope)
                failures = 0
                self.stats.watch_restarts += 1
                self._working(scope)  # the server ended a watch it had accepted
            except Gone as error:
                # The first 410 relists at once; a relist that keeps expiring (a paged
                # list whose continue token outlived the server's history) backs off.
                self.stats.relists_after_gone += 1
                need_list = True
                if gone_streak:
                    self.stats.last_error = str(error)
                    self._failed(scope, error, gone_streak + 1)  # a relist that never lands is stale too
                    await self._backoff.sleep(gone_streak - 1)
                gone_streak += 1
            except Exception as error:  # any failure: back off and try again, never die
                if isinstance(error, KindNotFound):
                    need_list = True
                self.stats.last_error = str(error)
                self.stats.watch_restarts += 1
                self._failed(scope, error, failures + 1)
                # While the cluster is known unreachable, resume as soon as it answers again.
                await self._backoff.sleep(failures, wake=health.recovery())
                failures += 1

    def _failed(self, scope: str | None, error: Exception, streak: int) -> None:
        """Record a failed list or watch; warn, once, when it is persistent and no one else names it.

        A dropped watch or a server restarting is a blip (INFO). A kind the
        server no longer serves (a 404 for the whole collection), or three
        failures in a row, are not, unless the cluster's own health already
        says why: a 401 or 403 (its missing permissions) or a cluster found
        unreachable.
        """
        persistent = isinstance(error, (KindNotFound, NotFound)) or streak >= _PERSISTENT_AFTER
        if persistent:
            self._failing[scope] = error
            self.presence.found(self._failing.values())
        health = self.client.transport.health
        refused = isinstance(error, (Forbidden, Unauthorized, Unreachable))
        named = refused or health.state is HealthState.UNHEALTHY
        if persistent and not named and type(error) is not self._warned.get(scope):
            self._warned[scope] = type(error)
            if isinstance(error, KindNotFound) and self.presence.may_be_absent:
                log.info("%r: %s; it may be, and is watched for until it is installed", self, error)
                return
            log.warning(
                "%r: listing or watching fails (attempt %d): %s; its store keeps what it last heard, "
                "and it retries with backoff until this passes",
                self,
                streak,
                error,
            )
        elif named or type(error) is self._warned.get(scope):
            # Its cluster's own line (health, permissions) or our warning above already names
            # it: every retry at INFO would repeat it for as long as it lasts.
            log.debug("%r: %s; retrying with backoff (failure %d)", self, error, streak)
        else:
            log.info("%r: %s; retrying with backoff (failure %d)", self, error, streak)

    def _working(self, scope: str | None) -> None:
        """A list succeeded or an event arrived for ``scope``: whatever was failing it has stopped."""
        error = self._failing.pop(scope, None)
        if error is not None:
            self.presence.found(self._failing.values())
        if self._warned.pop(scope, None) is not None:
            log.info("%r: listing and watching work again (it had failed with: %s)", self, error)

    async def _relist(self, scope: str | None) -> None:
        listed: dict[str, JSON] = {}
        result = await self.client.list(
            self.kind,
            namespace=scope,
            label_selector=self.label_selector.text or None,
            field_selector=self.field_selector,
            page_size=self._page_size,
            metadata_only=self.metadata_only,
        )
        for obj in result.items:
            prepared = self._prepare(obj)
            listed[object_key(prepared)] = prepared
        self.stats.lists += 1
        if scope in self._listed:
            self.stats.relists += 1
        self._replace(listed, result.resource_version, scope)

    def _replace(self, listed: dict[str, JSON], resource_version: str, scope: str | None = None) -> None:
        """Make the store's part for ``scope`` equal ``listed`` and emit what changed."""
        prefix = f"{scope}/" if scope is not None and (self._streams or (None,)) != (scope,) else ""
        for key in [key for key in self.store.objects if key.startswith(prefix) and key not in listed]:
            gone = self.store.pop(key)
            if gone is not None:
                self._emit_delete(gone)
        for key, obj in listed.items():
            old = self.store.put(key, obj)
            if old is None:
                self._emit_add(obj, True)
            elif metadata(old).get("resourceVersion") != metadata(obj).get("resourceVersion"):
                self._emit_update(old, obj)
        self._versions[scope] = resource_version
        self._listed.add(scope)
        if not self.has_synced and self._listed.issuperset(self._streams or (scope,)):
            self.stats.sync_seconds = time.monotonic() - self._created
            self._synced.set()

    async def _watch(self, scope: str | None) -> None:
        # Events are handled as the connection reads them (no task wake-up per event).
        request = WatchRequest(
            self.kind,
            namespace=scope,
            resource_version=self._versions.get(scope, ""),
            label_selector=self.label_selector.text or None,
            field_selector=self.field_selector,
            allow_bookmarks=True,
            timeout_seconds=random.randint(300, 600),  # noqa: S311
            read_timeout=self._read_timeout,
            metadata_only=self.metadata_only,
        )
        await self.client._watch_each(
            request, lambda event: self._on_event(scope, event), lambda: self._opened(scope)
        )

    def _opened(self, scope: str | None) -> None:
        """The server accepted the watch: a silence or a refusal is over (a quiet cluster sends no event).

        Only those: a server that accepts every watch and then breaks it (a line
        it never ends, garbage) would otherwise flap between failing and working
        at every reconnect; its failure clears with the first good event.
        """
        if isinstance(self._failing.get(scope), (Unreachable, Forbidden, Unauthorized)):
            self._working(scope)

    def _on_event(self, scope: str | None, event: WatchEvent) -> None:
        if self._failing:
            self._working(scope)
        obj = event.object
        version = metadata(obj).get("resourceVersion")
        if event.type == "BOOKMARK":
            if version:
                self._versions[scope] = str(version)
            return
        self.stats.events += 1
        prepared = self._prepare(obj)
        key = object_key(prepared)
        if event.type == "DELETED":
            self.store.pop(key)
            self._emit_delete(prepared)
        elif event.type in ("ADDED", "MODIFIED"):
            old = self.store.put(key, prepared)
            if old is None:
                self._emit_add(prepared, False)
            else:
                self._emit_update(old, prepared)
        if version:
            self._versions[scope] = str(version)

    async def _resync_loop(self, period: float) -> None:
        while True:
            await asyncio.sleep(period)
            if self.has_synced:
                for obj in list(self.store.objects.values()):
                    self._emit_update(obj, obj)
