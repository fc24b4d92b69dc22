"""What an API server answers must have the shape of an answer, or it is a named error.

A server that is broken, or hostile, can send a watch line that is not an event,
an object without a name, HTML with a 200, or a list whose ``continue`` token
never ends. Taken as they come, these stored objects under an empty key, handed
bytes to a caller that expected an object, or listed forever without a word in
the log. Each is refused here with an :class:`~mcruntime.APIError` naming the
cluster, the kind and what was wrong, and the informer's backoff and failure
record take it from there.
"""

from __future__ import annotations

from typing import Any

import orjson

from .._base.errors import ServerError

EVENT_TYPES = frozenset({"ADDED", "MODIFIED", "DELETED", "BOOKMARK", "ERROR"})
MAX_PAGES = 10_000
"""Pages of one list: 5 million objects at the default 500 a page, and a bound on a token that never ends."""


def malformed(cluster: str, kind: str, what: str) -> ServerError:
    """The error for an answer that is not what the API answers."""
    return ServerError(f"the server's answer is malformed: {what}", cluster=cluster, kind=kind)


def watch_event(line: bytes, cluster: str, kind: str) -> tuple[str, dict[str, Any]]:
    """A watch line's type and object, checked: a known type, an object, and a name unless a bookmark."""
    try:
        event = orjson.loads(line)
    except orjson.JSONDecodeError as error:
        raise malformed(cluster, kind, f"a watch line is not JSON ({error})") from None
    if not isinstance(event, dict):
        raise malformed(cluster, kind, f"a watch line is a JSON {type(event).__name__}, not an event")
    event_type, obj = event.get("type"), event.get("object")
    if event_type not in EVENT_TYPES:
        shown = repr(event_type)[:40]
        raise malformed(cluster, kind, f"a watch event's type is {shown}, not one of {sorted(EVENT_TYPES)}")
    if not isinstance(obj, dict):
        raise malformed(cluster, kind, f"a {event_type} event's object is a {type(obj).__name__}")
    if event_type in ("ADDED", "MODIFIED", "DELETED"):
        metadata = obj.get("metadata")
        name = metadata.get("name") if isinstance(metadata, dict) else None
        if not isinstance(name, str) or not name:
            raise malformed(cluster, kind, f"a {event_type} event's object has no metadata.name")
    return event_type, obj


def json_answer(decoded: object, cluster: str, kind: str, request: str) -> None:
    """Refuse a 2xx answer that is not a JSON object (a proxy's HTML login page, say)."""
    if decoded is not None and not isinstance(decoded, dict):
        what = "is not JSON" if isinstance(decoded, bytes) else f"is a JSON {type(decoded).__name__}"
        raise malformed(cluster, kind, f"the answer to {request} {what}, not an object")


def list_page(page: dict[str, Any], cluster: str, kind: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """A list page's metadata and items, checked: every item an object with a name."""
    meta = page.get("metadata") or {}
    items = page.get("items") or []
    if not isinstance(meta, dict) or not isinstance(items, list):
        raise malformed(cluster, kind, "a list page's metadata is not an object or its items not a list")
    for item in items:
        metadata = item.get("metadata") if isinstance(item, dict) else None
        name = metadata.get("name") if isinstance(metadata, dict) else None
        if not isinstance(name, str) or not name:
            raise malformed(cluster, kind, "a listed item is not an object with a metadata.name")
    return meta, items


def next_page(token: object, previous: str | None, pages: int, cluster: str, kind: str) -> str | None:
    """The list's next ``continue`` token, or ``None`` at the end; a token that cannot end is refused."""
    if not token:
        return None
    if not isinstance(token, str):
        raise malformed(cluster, kind, f"a list's continue token is a {type(token).__name__}")
    if token == previous:
        raise malformed(cluster, kind, "a list page gave back the continue token it was asked with")
    if pages >= MAX_PAGES:
        raise malformed(cluster, kind, f"a list went on past {MAX_PAGES} pages")
    return token


def is_status(decoded: Any) -> bool:
    """Whether an answer is a ``Status`` object: the API's own refusal, not a proxy's or the mux's page."""
    return isinstance(decoded, dict) and decoded.get("kind") == "Status"


def decode_answer(raw: bytes) -> Any:
    """An answer's JSON, or its bytes as they came when not JSON (a proxy's page, ``404 page not found``)."""
    if not raw:
        return None
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return raw
