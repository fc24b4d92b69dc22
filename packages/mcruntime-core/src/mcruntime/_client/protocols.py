"""What reading and writing objects means, apart from who does it.

:class:`Reader` and :class:`Writer` are the public methods a reconciler calls
on ``cluster.client`` and ``cluster.cache``. :class:`Client` is both (a read is
a request), :class:`~mcruntime.Cache` is a reader (a read is a copy from an
informer). Code that only reads or writes should ask for these, not for a
concrete class, so wrapping one (pinning it to a namespace, routing it to the
request's cluster) means delegating to its public methods, not overriding its
private ones: a change in how a :class:`Client` builds its requests then cannot
bypass the wrapper.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, Protocol, TypeVar

from .._base.kind import Kind
from .._base.objects import JSON
from .client import PatchType

ListT_co = TypeVar("ListT_co", covariant=True)


class Reader(Protocol[ListT_co]):
    """Reads by key and by selector; ``list`` answers what the reader holds (``ListT_co``).

    A client's list is an :class:`~mcruntime.ObjectList` (items and the
    resourceVersion to watch from); a cache's is a ``list`` of copies.
    """

    async def get(self, kind: Kind, name: str, *, namespace: str | None = None) -> JSON:
        """One object; raises :class:`~mcruntime.NotFound` when there is none."""
        ...

    async def get_or_none(self, kind: Kind, name: str, *, namespace: str | None = None) -> JSON | None:
        """One object, or ``None`` when there is none (every other failure raises)."""
        ...

    async def list(
        self,
        kind: Kind,
        *,
        namespace: str | None = None,
        label_selector: str | Mapping[str, str] | None = None,
    ) -> ListT_co:
        """The matching objects; ``namespace=None`` means every namespace the reader sees."""
        ...


class Writer(Protocol):
    """Writes: create, replace, patch, apply and delete one object."""

    async def create(
        self,
        obj: Any,
        *,
        namespace: str | None = None,
        field_manager: str | None = None,
        dry_run: bool = False,
    ) -> JSON: ...

    async def update(self, obj: Any, *, field_manager: str | None = None, dry_run: bool = False) -> JSON: ...

    async def update_status(
        self, obj: Any, *, field_manager: str | None = None, dry_run: bool = False
    ) -> JSON: ...

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
    ) -> JSON: ...

    async def apply(
        self,
        obj: Any,
        *,
        field_manager: str | None = None,
        force: bool = False,
        subresource: str | None = None,
        dry_run: bool = False,
    ) -> JSON: ...

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
    ) -> JSON | None: ...
