"""Create-or-update and create-or-patch: make an object look as a mutate function says.

The most common reconcile step: "this child must exist and have these
fields". Written by hand it is a get, a branch on NotFound, a copy, a compare
and a write, and it is easy to write an update on every pass (the object's
resourceVersion churns, every watcher wakes) or to clobber fields another
controller owns. Here the mutate function sets only the fields it cares about
on the object as it is stored, nothing is written when that changes nothing,
and the answer says what happened, for logs and events.
"""

from __future__ import annotations

import enum
import inspect
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from .._base.kind import Kind
from .._base.objects import JSON, json_copy
from .._client.client import Client
from .patch import merge_patch

__all__ = ["MutateFunction", "Operation", "create_or_patch", "create_or_update"]

MutateFunction = Callable[[JSON], "Awaitable[None] | None"]
"""Sets the wanted fields on the object it is given, in place (sync or async)."""


class Operation(enum.StrEnum):
    """What :func:`create_or_update` or :func:`create_or_patch` did."""

    CREATED = "created"
    """The object did not exist and was created."""
    UPDATED = "updated"
    """The object existed and was changed (its spec, its status, or both)."""
    UNCHANGED = "unchanged"
    """The object already looked as the mutate function wants: nothing was written."""


async def _mutate(mutate: MutateFunction, obj: JSON, key: tuple[str, str, str | None]) -> None:
    result = mutate(obj)
    if inspect.isawaitable(result):
        await result
    meta = obj.get("metadata") or {}
    if (obj.get("kind"), meta.get("name"), meta.get("namespace") or None) != key:
        raise ValueError(
            f"the mutate function changed the kind, name or namespace of {key[0]} {key[1]!r}; "
            "it may change only the object's fields"
        )


async def _start(
    client: Client, obj: Mapping[str, Any], mutate: MutateFunction, field_manager: str | None, dry_run: bool
) -> tuple[Kind, tuple[str, str, str | None], JSON | None, JSON | None]:
    kind = Kind.of(dict(obj))
    meta = obj.get("metadata") or {}
    if not meta.get("name"):
        raise ValueError(
            f"{kind.kind}: create-or-update needs metadata.name (generateName cannot be looked up)"
        )
    key = (kind.kind, str(meta["name"]), meta.get("namespace") or None)
    current = await client.get_or_none(kind, key[1], namespace=key[2])
    if current is not None:
        return kind, key, current, None
    wanted: JSON = json_copy(dict(obj))
    await _mutate(mutate, wanted, key)
    created = await client.create(wanted, field_manager=field_manager, dry_run=dry_run)
    return kind, key, None, created


async def create_or_update(
    client: Client,
    obj: Mapping[str, Any],
    mutate: MutateFunction,
    *,
    field_manager: str | None = None,
    dry_run: bool = False,
) -> tuple[Operation, JSON]:
    """Create ``obj`` or update the stored one, as ``mutate`` says; returns what happened and the result.

    ``obj`` names the object (apiVersion, kind, name, namespace) and is the
    starting point when it does not exist. ``mutate`` runs on a copy of
    what is stored (or of ``obj``) and sets the wanted fields; when the
    result equals what is stored, nothing is written (``UNCHANGED``). The
    update carries the stored resourceVersion, so a concurrent write makes
    it a :class:`~mcruntime.Conflict`: let the controller requeue, the next
    pass starts from the new object. Status is not written (the update goes
    to the main resource, which ignores status where a status subresource
    exists): use :func:`create_or_patch` to write both.
    """
    _kind, key, current, created = await _start(client, obj, mutate, field_manager, dry_run)
    if created is not None:
        return Operation.CREATED, created
    assert current is not None
    before = json_copy(current)
    await _mutate(mutate, current, key)
    if current == before:
        return Operation.UNCHANGED, current
    return Operation.UPDATED, await client.update(current, field_manager=field_manager, dry_run=dry_run)


async def create_or_patch(
    client: Client,
    obj: Mapping[str, Any],
    mutate: MutateFunction,
    *,
    field_manager: str | None = None,
    dry_run: bool = False,
) -> tuple[Operation, JSON]:
    """Like :func:`create_or_update`, but sends only what ``mutate`` changed, as merge patches.

    A field ``mutate`` did not touch is not in the patch, so another writer's
    concurrent change to it survives (an update would overwrite it with what
    was read). Changes to ``status`` go to the status subresource in a second
    patch (the main resource ignores them). A list ``mutate`` changed is
    sent whole, as merge patches do: a concurrent change to the same list is
    overwritten. On create, status is created as given where the kind has no
    status subresource, and dropped by the server where it has one.
    """
    kind, key, current, created = await _start(client, obj, mutate, field_manager, dry_run)
    if created is not None:
        return Operation.CREATED, created
    assert current is not None
    before = json_copy(current)
    await _mutate(mutate, current, key)
    before_status, after_status = before.pop("status", None), current.get("status")
    after = {field: value for field, value in current.items() if field != "status"}
    result = current
    changed = False
    main_patch = merge_patch(before, after)
    if main_patch:
        result = await client.patch(
            kind, key[1], main_patch, namespace=key[2], field_manager=field_manager, dry_run=dry_run
        )
        changed = True
    if before_status != after_status:
        status_patch = merge_patch(
            {"status": before_status} if before_status is not None else {},
            {"status": after_status} if after_status is not None else {},
        )
        result = await client.patch(
            kind,
            key[1],
            status_patch,
            namespace=key[2],
            subresource="status",
            field_manager=field_manager,
            dry_run=dry_run,
        )
        changed = True
    return (Operation.UPDATED if changed else Operation.UNCHANGED), result
