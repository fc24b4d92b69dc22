"""The discovery loop of watch-based providers, written once.

A provider that learns its clusters from objects on a hub (Secrets, Cluster API
Clusters, KubeFedClusters) does the same thing every time: run some informers,
and after any event make its :class:`ClusterSet` equal to what the stores now
say. :func:`follow_informers` is that loop, and :func:`hub_connection` the hub
connection each of them opens. It is level-triggered (each pass
reads the whole stores, so a missed or coalesced event costs nothing), it
applies a pass completely even when cancelled halfway (a replacement that
started must finish, or its old cluster would leak), it retries a failed pass
with backoff, and it stops every cluster only after discovery has ended.

Such a provider also depends on a kind the hub may not serve yet: Cluster API
or KubeFed is often installed after the controller that uses it.
:func:`wait_for_kind` waits for it (reporting "not installed, waiting") rather
than failing, so the manager and its other clusters keep running meanwhile;
a provider told not to wait raises its :class:`KindNotInstalled` instead.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any

from .._base.backoff import DEFAULT_BACKOFF, Backoff
from .._base.errors import KindNotFound, MCRuntimeError
from .._base.kind import Kind
from .._cache.informer import Informer, ResourceEventHandler
from .._config.kubeconfig import ClusterConfig
from .cluster import Cluster, ClusterOptions
from .clusterset import ClusterSet
from .protocols import Aware

log = logging.getLogger("mcruntime.follow")

Desired = Callable[[], Mapping[str, ClusterConfig] | Awaitable[Mapping[str, ClusterConfig]]]
Watcher = Callable[[Callable[[], None]], Coroutine[Any, Any, None]]
"""Follows one input that is not an informer; calls the function it is given to ask for a pass."""
"""Reads the stores and returns the clusters that should exist; may be async (to parse off the loop)."""

KIND_WAIT_BACKOFF = Backoff(base=1.0, cap=30.0)
"""How often a missing kind is looked for again: soon after start, then every 15-30 s."""


class KindNotInstalled(MCRuntimeError):
    """The hub serves none of the kinds a provider needs, and the provider was told not to wait.

    Raised by :func:`wait_for_kind` with ``wait=False``; each provider that
    watches a hub raises its own subclass (``ClusterAPINotInstalled``,
    ``KubeFedNotInstalled``...), so catching this catches them all.
    """


@asynccontextmanager
async def hub_connection(
    hub: ClusterConfig | Cluster, name: str, options: ClusterOptions | None = None
) -> AsyncIterator[Cluster]:
    """The hub a provider watches: its own connection from a config, or the caller's cluster.

    A :class:`Cluster` passed in belongs to the caller and is used, never
    stopped; a config gets a connection of the provider's own, closed on exit.
    """
    if isinstance(hub, Cluster):
        yield hub
        return
    async with Cluster(name, hub, options) as connection:
        yield connection


async def follow_informers(
    clusters: ClusterSet,
    aware: Aware,
    informers: Sequence[Informer],
    desired: Desired,
    *,
    owner: str,
    applied: Callable[[], None] | None = None,
    backoff: Backoff | None = None,
    watchers: Sequence[Watcher] = (),
) -> None:
    """Run ``informers`` and keep ``clusters`` equal to ``desired()`` until cancelled.

    ``desired()`` is called after every batch of events, once all informers
    have synced; it reads the informers' stores and returns the clusters that
    should exist. It may be a coroutine function, so that parsing what
    changed can run in a thread instead of on the event loop. ``applied()``
    runs once the ClusterSet has acted on a pass: the moment to publish
    statuses, so readers never see a status ahead of the clusters it
    describes. A pass that raises is retried after ``backoff``
    (consecutive failures wait longer, up to its cap), for as long as it takes.
    ``watchers`` follow inputs that are not informers (a provider's own
    configuration file, say): each runs alongside the informers, is given a
    function that asks for a pass, and must report its own errors rather than
    raise, since a watcher that raises ends discovery.
    """
    changed = asyncio.Event()
    changed.set()  # one pass once synced, even if no object ever arrives: an empty hub is an answer too
    retry = DEFAULT_BACKOFF if backoff is None else backoff

    def poke(*_event: object) -> None:  # handlers must be quick: just say "look again"
        changed.set()

    for informer in informers:
        informer.add_handler(ResourceEventHandler(on_add=poke, on_update=poke, on_delete=poke))
    engaging = asyncio.create_task(clusters.run(aware), name=f"{owner}:clusters")
    try:
        async with asyncio.TaskGroup() as discovery:
            for index, informer in enumerate(informers):
                discovery.create_task(informer.run(), name=f"{owner}:informer-{index}")
            for index, watcher in enumerate(watchers):
                discovery.create_task(watcher(poke), name=f"{owner}:watcher-{index}")
            discovery.create_task(
                _apply_changes(clusters, informers, desired, applied, changed, owner, retry),
                name=f"{owner}:follow",
            )
    finally:
        # Discovery has ended, so no change is half applied: now stop every cluster.
        engaging.cancel()
        await asyncio.gather(engaging, return_exceptions=True)


async def _apply_changes(
    clusters: ClusterSet,
    informers: Sequence[Informer],
    desired: Desired,
    applied: Callable[[], None] | None,
    changed: asyncio.Event,
    owner: str,
    backoff: Backoff,
) -> None:
    failures = 0
    logged: str | None = None
    while True:
        await changed.wait()
        changed.clear()
        if not all(informer.has_synced for informer in informers):
            await asyncio.gather(*(informer.wait_for_sync() for informer in informers))
        try:
            wanted = desired()
            if inspect.isawaitable(wanted):
                wanted = await wanted
            await clusters.sync(wanted)  # finishes even if cancelled: a started replacement must end
            if applied is not None:
                applied()
            failures, logged = 0, None
        except Exception as error:  # never let one bad pass end discovery: retry with backoff
            delay = backoff.delay(failures)
            failures += 1
            # Each new failure at ERROR with its traceback; the same one again only at DEBUG.
            message = f"{type(error).__name__}: {error}"
            log.log(
                logging.ERROR if message != logged else logging.DEBUG,
                "%s: applying the discovered clusters failed (%d in a row); retrying in %.1fs",
                owner,
                failures,
                delay,
                exc_info=True,
            )
            logged = message
            await asyncio.sleep(delay)
            changed.set()


async def wait_for_kind(
    hub: Cluster,
    candidates: Sequence[Kind],
    *,
    owner: str,
    what: str,
    report: Callable[[str | None], None] | None = None,
    backoff: Backoff | None = None,
    wait: bool = True,
    not_installed: type[KindNotInstalled] = KindNotInstalled,
) -> Kind:
    """The first of ``candidates`` the hub serves, waiting for as long as it serves none.

    A provider calls this before starting its informers. While no candidate
    is served (its CRD is not installed yet) or the hub cannot be asked, the
    wait is reported through ``report(message)`` and logged once at WARNING
    (then at DEBUG on each further look, after ``backoff``: by default 1 s
    doubling to 30 s), and discovery is refreshed on each look so a CRD
    installed meanwhile is found. ``report(None)`` says the wait is over.
    ``what`` names the missing product in messages (``"Cluster API"``).

    With ``wait=False`` the hub is asked once: a hub that serves no
    candidate raises ``not_installed`` (a :class:`KindNotInstalled`) at once,
    and an error asking it is raised as it is.
    """
    server = hub.config.server
    if backoff is None:
        backoff = KIND_WAIT_BACKOFF
    served = ", ".join(f"{kind.kind} ({kind.api_version})" for kind in candidates)
    if not wait:
        for kind in candidates:
            try:
                await hub.client.resource(kind)
            except KindNotFound:
                continue
            return kind
        raise not_installed(f"{what} not installed: the hub {server} serves no {served}")
    failures = 0
    logged: str | None = None
    while True:
        problem: str
        try:
            if failures:
                await hub.client.discovery.refresh()
            for kind in candidates:
                try:
                    await hub.client.resource(kind)
                except KindNotFound:
                    continue
                if failures:
                    log.info("%s: the hub now serves %s; starting", owner, kind)
                if report is not None:
                    report(None)
                return kind
            problem = f"{what} not installed: the hub {server} serves no {served}; waiting for it"
            reason = "not installed"
        except asyncio.CancelledError:
            raise
        except Exception as error:  # unreachable, forbidden: the same wait, another reason
            problem = f"cannot tell whether {what} is installed: the hub {server} did not answer ({error})"
            # Logged once per kind of error: a hung hub's error text changes from look to look.
            reason = type(error).__name__
        if report is not None:
            report(problem)
        if reason != logged:
            log.warning("%s: %s", owner, problem)
            logged = reason
        else:
            log.debug("%s: %s", owner, problem)
        delay = backoff.delay(failures)
        failures += 1
        await asyncio.sleep(delay)
