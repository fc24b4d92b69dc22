"""A watch's request and its body cut into event lines, shared by the two ways of reading it.

:meth:`Client.watch` yields events to an ``async for``; the informer's path
(:meth:`Client._watch_each`) hands them to a callback inside the connection's
read. Both build the same request and split the same bytes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

from .._base.errors import APIError
from .._base.kind import Kind, Resource

# One watch event carries one object; etcd refuses objects over 1.5 MiB. A server
# streaming far more without a line break is broken or hostile: stop buffering it.
MAX_WATCH_EVENT_BYTES = 32 * 2**20


def selector_text(value: str | Mapping[str, str] | None) -> str | None:
    """A label selector as the API takes it: text as given, a mapping as ``k=v,...``."""
    if value is None or isinstance(value, str):
        return value
    return ",".join(f"{key}={val}" for key, val in value.items())


class WatchRequest(NamedTuple):
    """What a watch asks for: :meth:`Client.watch`'s arguments, kept together."""

    kind: Kind
    namespace: str | None = None
    resource_version: str | None = None
    label_selector: str | Mapping[str, str] | None = None
    field_selector: str | None = None
    allow_bookmarks: bool = True
    timeout_seconds: int | None = None
    read_timeout: float | None = 90.0
    metadata_only: bool = False

    def params(self) -> dict[str, str]:
        """The query of the watch's GET."""
        params: dict[str, str] = {"watch": "true"}
        if self.resource_version:
            params["resourceVersion"] = self.resource_version
        if self.allow_bookmarks:
            params["allowWatchBookmarks"] = "true"
        if (selector := selector_text(self.label_selector)) is not None:
            params["labelSelector"] = selector
        if self.field_selector:
            params["fieldSelector"] = self.field_selector
        if self.timeout_seconds:
            params["timeoutSeconds"] = str(self.timeout_seconds)
        return params

    def options(self) -> dict[str, Any]:
        """The keyword arguments of :meth:`Client.watch` that ask for the same watch."""
        options = self._asdict()
        del options["kind"]
        return options


class Lines:
    """A watch body cut at its line breaks, chunk by chunk, with a bound on one event's size.

    A chunk is most often whole events: it is split as it came, and only the part
    of an event that continues in the next chunk is copied into the buffer. (We
    split ourselves: aiohttp's ``readline`` caps a line's length, and one event
    carries a whole object.)
    """

    __slots__ = ("_buffer", "_cluster", "_resource")

    def __init__(self, resource: Resource, cluster: str) -> None:
        self._buffer = bytearray()
        self._resource = resource
        self._cluster = cluster

    def feed(self, chunk: bytes) -> list[bytes]:
        """The events this chunk completes; :class:`APIError` once an event outgrows the bound."""
        buffer = self._buffer
        if b"\n" not in chunk:
            buffer += chunk
            if len(buffer) > MAX_WATCH_EVENT_BYTES:
                raise APIError(
                    f"watch of {self._resource.plural} sent an event over "
                    f"{MAX_WATCH_EVENT_BYTES // 2**20} MiB; dropping the connection",
                    cluster=self._cluster,
                    kind=self._resource.kind,
                )
            return []
        if buffer:
            buffer += chunk
            chunk = bytes(buffer)
            buffer.clear()
        *lines, rest = chunk.split(b"\n")
        if rest:
            buffer += rest
        return [line for line in lines if line and not line.isspace()]

    def rest(self) -> bytes | None:
        """What is left after the stream ended: a last event without its line break, if any."""
        buffer = self._buffer
        return bytes(buffer) if buffer and not buffer.isspace() else None
