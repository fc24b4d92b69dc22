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
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager

from ._cluster import Cluster, ClusterOptions
from ._clusterset import ClusterSet
from ._informer import Informer, ResourceEventHandler
from ._kubeconfig import ClusterConfig
from ._provider import Aware

log = logging.getLogger("mcruntime.follow")

Desired = Callable[[], Mapping[str, ClusterConfig]]


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
) -> None:
    """Run ``informers`` and keep ``clusters`` equal to ``desired()`` until cancelled.

    ``desired()`` is called after every batch of events, once all informers
    have synced; it reads the informers' stores and returns the clusters that
    should exist. ``applied()`` runs once the ClusterSet has acted on a pass:
    the moment to publish statuses, so readers never see a status ahead of the
    clusters it describes.
    """
    changed = asyncio.Event()

    def poke(*_event: object) -> None:  # handlers must be quick: just say "look again"
        changed.set()

    for informer in informers:
        informer.add_handler(ResourceEventHandler(on_add=poke, on_update=poke, on_delete=poke))
    engaging = asyncio.create_task(clusters.run(aware), name=f"{owner}:clusters")
    try:
        async with asyncio.TaskGroup() as discovery:
            for index, informer in enumerate(informers):
                discovery.create_task(informer.run(), name=f"{owner}:informer-{index}")
            discovery.create_task(
                _apply_changes(clusters, informers, desired, applied, changed, owner), name=f"{owner}:follow"
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
) -> None:
    failures = 0
    while True:
        await changed.wait()
        changed.clear()
        if not all(informer.has_synced for informer in informers):
            await asyncio.gather(*(informer.wait_for_sync() for informer in informers))
        try:
            sync = asyncio.ensure_future(clusters.sync(desired()))
            try:
                await asyncio.shield(sync)
            except asyncio.CancelledError:
                await asyncio.gather(sync, return_exceptions=True)
                raise
            if applied is not None:
                applied()
            failures = 0
        except Exception:  # never let one bad pass end discovery: retry with backoff
            failures += 1
            delay = min(30.0, 0.2 * 2**failures) * random.uniform(0.5, 1.0)  # noqa: S311
            log.exception("%s: applying the discovered clusters failed; retrying in %.1fs", owner, delay)
            await asyncio.sleep(delay)
            changed.set()
