"""Adding and removing a finalizer, safely next to other controllers.

``metadata.finalizers`` is a list several controllers share, and a merge
patch can only replace a list whole. Sending the new list blindly would drop a
finalizer another controller added a moment ago, so every patch here carries
the ``resourceVersion`` (and ``uid``) the list was computed from: the API
server refuses it with 409 Conflict if the object changed since. Then the
object is read again and the change recomputed, a bounded number of times, on
the one :class:`~mcruntime.Backoff`. The uid guard means a finalizer is never
put on, or taken off, a different object that took the same name.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from .._base.backoff import DEFAULT_BACKOFF, Backoff
from .._base.errors import Conflict, NotFound
from .._base.kind import Kind
from .._base.objects import JSON
from .._client.client import Client

__all__ = ["add_finalizer", "has_finalizer", "remove_finalizer"]

log = logging.getLogger("mcruntime.toolkit")


def has_finalizer(obj: Mapping[str, Any], finalizer: str) -> bool:
    """Whether ``finalizer`` is in the object's ``metadata.finalizers``."""
    return finalizer in ((obj.get("metadata") or {}).get("finalizers") or [])


async def add_finalizer(
    client: Client,
    obj: Mapping[str, Any],
    finalizer: str,
    *,
    attempts: int = 5,
    backoff: Backoff = DEFAULT_BACKOFF,
    field_manager: str | None = None,
    dry_run: bool = False,
) -> JSON:
    """Make sure ``obj`` carries ``finalizer``; returns the object as stored.

    No request is made when ``obj`` already has it. A conflict (someone wrote
    the object since ``obj`` was read) re-reads and retries, at most
    ``attempts`` tries in all, then raises :class:`~mcruntime.Conflict`. An
    object deleted meanwhile raises :class:`~mcruntime.NotFound`; one that is
    already being deleted gets no new finalizer (the server refuses that) and
    is returned as it is.
    """

    def change(finalizers: list[str]) -> list[str] | None:
        return None if finalizer in finalizers else [*finalizers, finalizer]

    result = await _patch_finalizers(client, obj, change, attempts, backoff, field_manager, dry_run, add=True)
    assert result is not None  # adding raises NotFound rather than answering None
    return result


async def remove_finalizer(
    client: Client,
    obj: Mapping[str, Any],
    finalizer: str,
    *,
    attempts: int = 5,
    backoff: Backoff = DEFAULT_BACKOFF,
    field_manager: str | None = None,
    dry_run: bool = False,
) -> JSON | None:
    """Make sure ``obj`` no longer carries ``finalizer``; returns the object as stored.

    ``None`` when the object is gone (removing the last finalizer of an
    object being deleted lets the server delete it, and a second remover
    finds nothing: both are success). Conflicts retry as :func:`add_finalizer`
    does. Whether there is anything to remove is decided on ``obj`` as
    given (no request when it lacks the finalizer), so pass the object as
    recently read as you have it: a cache copy is fine.
    """

    def change(finalizers: list[str]) -> list[str] | None:
        return [item for item in finalizers if item != finalizer] if finalizer in finalizers else None

    return await _patch_finalizers(client, obj, change, attempts, backoff, field_manager, dry_run, add=False)


async def _patch_finalizers(
    client: Client,
    obj: Mapping[str, Any],
    change: Callable[[list[str]], list[str] | None],
    attempts: int,
    backoff: Backoff,
    field_manager: str | None,
    dry_run: bool,
    *,
    add: bool,
) -> JSON | None:
    if attempts < 1:
        raise ValueError(f"attempts must be at least 1, not {attempts}")
    kind = Kind.of(dict(obj))
    meta = obj.get("metadata") or {}
    name, namespace, uid = meta.get("name"), meta.get("namespace"), meta.get("uid")
    if not name:
        raise ValueError(f"{kind.kind}: a finalizer needs an object with metadata.name")
    current: Mapping[str, Any] = obj
    failures = 0
    while True:
        current_meta = current.get("metadata") or {}
        wanted = change(list(current_meta.get("finalizers") or []))
        if wanted is None or (add and current_meta.get("deletionTimestamp")):
            return dict(current)
        guard: JSON = {"finalizers": wanted}
        if current_meta.get("resourceVersion"):
            guard["resourceVersion"] = current_meta["resourceVersion"]
        if uid:
            guard["uid"] = uid
        try:
            return await client.patch(
                kind,
                name,
                {"metadata": guard},
                namespace=namespace,
                field_manager=field_manager,
                dry_run=dry_run,
            )
        except NotFound:
            if add:
                raise
            return None
        except Conflict:
            failures += 1
            if failures >= attempts:
                raise
            log.debug("finalizers of %s %s changed meanwhile; retrying", kind.kind, name)
        await backoff.sleep(failures - 1)
        fresh = await client.get_or_none(kind, name, namespace=namespace)
        if fresh is None or (uid and (fresh.get("metadata") or {}).get("uid") != uid):
            if add:
                raise NotFound(
                    f"{kind.kind} {name!r} was deleted (or replaced) while adding a finalizer",
                    cluster=client.cluster,
                    status=404,
                    reason="NotFound",
                    kind=kind.kind,
                    namespace=namespace,
                    name=name,
                )
            return None
        current = fresh
