"""Finalizer-driven cleanup of an owner's children in every cluster of the fleet.

The garbage collector of one API server cannot delete children in another,
so an owner with children across the fleet carries a finalizer, and its
controller deletes the children everywhere before releasing it. The hard
part is a cluster that does not answer while this happens: releasing the
finalizer anyway leaves children running there for good, with nothing left
that knows they are orphans. So the finalizer is kept until every engaged
cluster has confirmed, the pass is retried on the one capped
:class:`~mcruntime.Backoff`, and which clusters are still pending, and why,
is in the result, in a warning log line and in a condition on the owner.

What "every cluster" means: the clusters engaged when the pass runs. An
unreachable cluster stays engaged (its health says unhealthy, its provider
still lists it), so it is waited for, however long it is away. A cluster its
provider has *disengaged* (kubeconfig deleted, Secret removed, Cluster API
object gone) has left the fleet: nothing will ever announce its return, so
waiting for it could hold the owner forever. It is not waited for, and the
release log line names the clusters that were cleaned; one that was pending
and left before the release is named in a warning and in
:attr:`CleanupResult.left_fleet`. Children left in such a cluster keep their owner
record; if the cluster is engaged again, :meth:`ChildCleanup.delete_orphans`
finds them.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Literal

from .._base.backoff import DEFAULT_BACKOFF, Backoff
from .._base.errors import APIError, Conflict, KindNotFound, NotFound
from .._base.kind import Kind
from .._base.objects import JSON, json_copy, metadata
from .._client.client import Client
from .._controllerutil.conditions import set_status_condition
from .._controllerutil.finalizers import has_finalizer, remove_finalizer
from .._controllerutil.patch import merge_patch
from .._fleet.cluster import Cluster
from .._reconcile.request import Result
from .ownership import ClusterOwner, cluster_owner_of, owned_by_kind_selector

__all__ = ["ChildCleanup", "CleanupResult"]

log = logging.getLogger("mcruntime.toolkit")

_MAX_TRACKED = 10_000  # owners whose cleanup is retrying; beyond it the oldest restart their backoff


@dataclass(frozen=True)
class CleanupResult:
    """What one cleanup pass did, per cluster.

    ``released`` is true only when the finalizer is off (or was never on):
    every engaged cluster confirmed its children deleted. Otherwise
    ``pending`` says, per cluster, why not, and ``requeue_after`` when to try
    again. ``left_fleet`` names clusters that were pending in an earlier pass
    and have been disengaged since: the release did not wait for them, and
    their children were not deleted.
    """

    released: bool
    deleted: Mapping[str, int] = field(default_factory=dict)
    """Per cluster, the children whose deletion this pass issued."""
    pending: Mapping[str, str] = field(default_factory=dict)
    """Per cluster whose children are not confirmed deleted: the error that stopped it."""
    requeue_after: float | None = None
    """Seconds until the next pass should run; ``None`` once released."""
    left_fleet: tuple[str, ...] = ()
    """Clusters pending earlier and disengaged since: not waited for, their children not deleted."""

    def result(self) -> Result | None:
        """The reconcile result that retries a pass that did not release: return it from ``reconcile``."""
        return None if self.requeue_after is None else Result(requeue_after=self.requeue_after)


class ChildCleanup:
    """Deletes an owner's children (of ``kinds``) in every engaged cluster, then drops ``finalizer``.

    ``clusters`` is what to clean: usually ``manager.clusters``, called on
    every pass so clusters engaged since are included. Children are found by
    their owner labels with a list from each API server (not a cache: a
    cache that is behind must not make a pass look done) and deleted only
    when their owner record names this very owner, uid included. A child is
    done once the server accepted its deletion: one with its own finalizers
    may outlive the owner by as long as they take.

    One pass holds a reconcile worker at most ``attempt_timeout`` seconds
    however many clusters hang (clusters are cleaned concurrently).
    ``condition_type`` is the condition written on the owner's status while
    children are pending (``None``: none); a kind without a status
    subresource just gets the log line.
    """

    def __init__(
        self,
        clusters: Callable[[], Mapping[str, Cluster]],
        finalizer: str,
        kinds: Iterable[Kind],
        *,
        backoff: Backoff = DEFAULT_BACKOFF,
        attempt_timeout: float = 15.0,
        propagation_policy: Literal["Foreground", "Background", "Orphan"] | None = "Background",
        condition_type: str | None = "ChildrenDeleted",
        field_manager: str | None = None,
    ) -> None:
        self._clusters = clusters
        self.finalizer = finalizer
        self.kinds: tuple[Kind, ...] = tuple(kinds)
        if not self.kinds:
            raise ValueError("ChildCleanup needs at least one child kind")
        self.backoff = backoff
        self.attempt_timeout = attempt_timeout
        self.propagation_policy: Literal["Foreground", "Background", "Orphan"] | None = propagation_policy
        self.condition_type = condition_type
        self.field_manager = field_manager
        # owner uid -> (passes that did not release, clusters pending in the last one, clusters
        # pending once and disengaged since)
        self._held: dict[str, tuple[int, frozenset[str], frozenset[str]]] = {}

    def __repr__(self) -> str:
        return f"<ChildCleanup finalizer={self.finalizer!r} kinds={[str(kind) for kind in self.kinds]}>"

    async def finalize(self, owner_cluster: str, owner: JSON) -> CleanupResult:
        """One pass for ``owner`` (being deleted, read from ``owner_cluster``).

        Returns at once with ``released=True`` when the finalizer is not on
        the owner. Raises :class:`ValueError` for an owner that is not being
        deleted: releasing its finalizer early is exactly what must not happen.
        """
        if not has_finalizer(owner, self.finalizer):
            return CleanupResult(released=True)
        record = ClusterOwner.of(owner_cluster, owner)
        if not metadata(owner).get("deletionTimestamp"):
            raise ValueError(
                f"{record.kind} {record.namespace}/{record.name} of cluster {owner_cluster!r} is not being "
                "deleted; finalize it only once it has a deletionTimestamp"
            )
        clusters = dict(self._clusters())
        failures, pending_before, left_before = self._held.get(record.uid, (0, frozenset(), frozenset()))
        left = {name for name in left_before | pending_before if name not in clusters}
        left_fleet = tuple(sorted(left))
        deleted, pending = await self._delete_everywhere(record, clusters)
        owner_home = clusters.get(owner_cluster)
        if owner_home is None:
            pending.setdefault(owner_cluster, "the owner's cluster is not engaged")
        if not pending:
            assert owner_home is not None
            try:
                await remove_finalizer(
                    owner_home.client,
                    owner,
                    self.finalizer,
                    backoff=self.backoff,
                    field_manager=self.field_manager,
                )
            except APIError as error:
                pending[owner_cluster] = f"releasing the finalizer failed: {error}"
            else:
                self._held.pop(record.uid, None)
                if left_fleet:
                    log.warning(
                        "%s %s/%s of cluster %r: finalizer %s released without deleting the children "
                        "in %s: pending before, they left the fleet (disengaged by the provider); "
                        "delete_orphans deletes them if they return",
                        record.kind,
                        record.namespace,
                        record.name,
                        owner_cluster,
                        self.finalizer,
                        ", ".join(repr(name) for name in left_fleet),
                    )
                log.info(
                    "%s %s/%s of cluster %r: children deleted in every engaged cluster (%s); "
                    "finalizer %s released",
                    record.kind,
                    record.namespace,
                    record.name,
                    owner_cluster,
                    ", ".join(repr(name) for name in sorted(clusters)),
                    self.finalizer,
                )
                return CleanupResult(released=True, deleted=deleted, left_fleet=left_fleet)
        self._held.pop(record.uid, None)  # re-inserted last: the oldest entry goes first
        self._held[record.uid] = (failures + 1, frozenset(pending), frozenset(left))
        while len(self._held) > _MAX_TRACKED:
            del self._held[next(iter(self._held))]
        delay = self.backoff.delay(failures)
        why = "; ".join(f"{name!r}: {reason}" for name, reason in sorted(pending.items()))
        log.warning(
            "%s %s/%s of cluster %r is being deleted but finalizer %s is kept: children not confirmed "
            "deleted in %d cluster(s) (%s); retrying in %.1fs",
            record.kind,
            record.namespace,
            record.name,
            owner_cluster,
            self.finalizer,
            len(pending),
            why,
            delay,
        )
        if owner_home is not None and self.condition_type:
            await self._report(owner_home.client, owner, pending)
        return CleanupResult(
            released=False, deleted=deleted, pending=pending, requeue_after=delay, left_fleet=left_fleet
        )

    async def _delete_everywhere(
        self, record: ClusterOwner, clusters: Mapping[str, Cluster]
    ) -> tuple[dict[str, int], dict[str, str]]:
        names = list(clusters)
        outcomes = await asyncio.gather(
            *(self._bounded(self._delete_in(clusters[name].client, record)) for name in names),
            return_exceptions=True,
        )
        deleted: dict[str, int] = {}
        pending: dict[str, str] = {}
        for name, outcome in zip(names, outcomes, strict=True):
            if isinstance(outcome, int):
                deleted[name] = outcome
            elif isinstance(outcome, TimeoutError):
                pending[name] = f"no answer within {self.attempt_timeout:g}s"
            elif isinstance(outcome, Exception):
                pending[name] = f"{type(outcome).__name__}: {outcome}"
            else:
                raise outcome  # cancellation and the like are not a cluster's failure
        return deleted, pending

    async def _bounded(self, work: Awaitable[int]) -> int:
        async with asyncio.timeout(self.attempt_timeout):
            count: int = await work
            return count

    async def _delete_in(self, client: Client, record: ClusterOwner) -> int:
        count = 0
        for kind in self.kinds:
            try:
                children = await client.list(kind, label_selector=record.selector())
            except KindNotFound:
                continue  # the kind is not served there: nothing of it can be a child
            for child in children.items:
                count += await self._delete_child(client, kind, child, record)
        return count

    async def _delete_child(self, client: Client, kind: Kind, child: JSON, owner: ClusterOwner) -> int:
        meta = metadata(child)
        if not owner.owns(child) or meta.get("deletionTimestamp"):
            return 0
        try:
            await client.delete(
                kind,
                meta.get("name", ""),
                namespace=meta.get("namespace") or None,
                propagation_policy=self.propagation_policy,
                uid=meta.get("uid"),
            )
        except NotFound:
            return 0
        except Conflict:
            return 0  # the uid precondition failed: the name now belongs to another object
        return 1

    async def _report(self, client: Client, owner: JSON, pending: Mapping[str, str]) -> None:
        assert self.condition_type is not None
        updated = json_copy(owner)
        clusters = ", ".join(repr(name) for name in sorted(pending))
        changed = set_status_condition(
            updated,
            self.condition_type,
            False,
            reason="ClustersPending",
            message=f"finalizer {self.finalizer} kept until children are deleted in {clusters}",
        )
        if not changed:
            return
        before = {"status": {"conditions": (owner.get("status") or {}).get("conditions") or []}}
        after = {"status": {"conditions": updated["status"]["conditions"]}}
        meta = metadata(owner)
        # Guarded: the list is replaced whole, so a condition someone wrote since must not be lost.
        guard = {"metadata": {"resourceVersion": meta.get("resourceVersion")}}
        try:
            await client.patch(
                Kind.of(owner),
                meta.get("name", ""),
                {**merge_patch(before, after), **guard},
                namespace=meta.get("namespace") or None,
                subresource="status",
                field_manager=self.field_manager,
            )
        except APIError as error:  # best effort (a conflict retries next pass): the log line said it
            log.debug("could not write condition %s: %s", self.condition_type, error)

    async def delete_orphans(self, cluster: str, owner_kind: Kind, *, namespace: str | None = None) -> int:
        """Delete children in ``cluster`` whose owner of ``owner_kind`` is gone; returns how many.

        For a cluster that was away (disengaged) while an owner was deleted:
        its children were not cleaned then. An owner is gone when its cluster
        answers NotFound for it, or has an object of that name with another
        uid; an owner whose cluster is not engaged, or does not answer, is
        assumed to exist. Lists every child of the owner kind in ``cluster``:
        run it when a cluster is engaged, not on every reconcile.
        ``namespace`` limits it to one namespace (``None``: all).
        """
        clusters = dict(self._clusters())
        target = clusters.get(cluster)
        if target is None:
            return 0
        gone: dict[str, bool] = {}
        count = 0
        for kind in self.kinds:
            try:
                children = await target.client.list(
                    kind, namespace=namespace, label_selector=owned_by_kind_selector(owner_kind)
                )
            except KindNotFound:
                continue
            for child in children.items:
                record = cluster_owner_of(child)
                if record is None or Kind(record.api_version, record.kind).group != owner_kind.group:
                    continue
                if record.kind != owner_kind.kind:
                    continue
                if record.uid not in gone:
                    gone[record.uid] = await self._owner_gone(clusters.get(record.cluster), record)
                if gone[record.uid]:
                    count += await self._delete_child(target.client, kind, child, record)
        if count:
            log.info("cluster %r: deleted %d child(ren) whose owner is gone", cluster, count)
        return count

    async def _owner_gone(self, home: Cluster | None, record: ClusterOwner) -> bool:
        if home is None:
            return False
        try:
            found = await home.client.get(record.kind_of, record.name, namespace=record.namespace or None)
        except NotFound:
            return True
        except APIError:
            return False
        return metadata(found).get("uid") != record.uid
