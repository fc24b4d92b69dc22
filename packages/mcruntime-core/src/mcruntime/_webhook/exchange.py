"""One webhook call as the server's logic sees it, whichever protocol carried it.

The API server calls over HTTP/2 when the webhook offers it, and over
HTTP/1.1 otherwise (or when told to). Both transports turn a request into a
:class:`Call` and send back the :class:`Reply` the logic returns, so routing,
limits and every error's wording are the same on both.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass


class BodyTooLarge(Exception):
    """The request's body passed the server's limit; the call is answered 413."""


class BodyLost(Exception):
    """The client gave up on the call (reset its stream or closed the connection) before its body ended."""


@dataclass(frozen=True, slots=True)
class Reply:
    """What the server answers: a status and a body of ``content_type``."""

    status: int
    body: bytes
    content_type: str = "application/json"

    @classmethod
    def text(cls, status: int, message: str) -> Reply:
        """A plain-text answer: an error a person reads in the API server's message."""
        return cls(status, (message + "\n").encode(), "text/plain; charset=utf-8")


@dataclass(frozen=True, slots=True)
class Call:
    """A request: its method, raw path (percent-encoded, no query), media type, and how to read its body.

    ``read`` returns the whole body, or raises :class:`BodyTooLarge` past the
    limit, or :class:`BodyLost`; the logic reads only once the call is routed,
    so a call for no webhook is refused without its body.
    """

    method: str
    path: str
    content_type: str
    read: Callable[[], Awaitable[bytes]]
    timeout: float | None = None
    """How long the caller waits for the answer, when it says (an API server's ``?timeout=10s``)."""


_DURATION = re.compile(r"(\d{1,9}(?:\.\d{0,9})?)(ns|us|µs|ms|s|m|h)")
_UNIT = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def caller_timeout(query: str) -> float | None:
    """The ``timeout`` an API server puts in a webhook call's query, in seconds; ``None`` if absent or odd.

    It is the configuration's ``timeoutSeconds`` as a Go duration (``10s``,
    ``1m0s``). The server answers before it runs out, so a hung handler is
    answered per ``on_error`` instead of failing as the API server's
    "context deadline exceeded". Only a short, well-formed value counts.
    """
    for field in query.split("&", 16)[:16]:
        name, _, value = field.partition("=")
        if name != "timeout" or not 0 < len(value) <= 32:
            continue
        parts = _DURATION.findall(value)
        if not parts or "".join(number + unit for number, unit in parts) != value:
            return None
        seconds = sum(float(number) * _UNIT[unit] for number, unit in parts)
        return seconds if seconds > 0 else None
    return None


Serve = Callable[[Call], Awaitable[Reply]]
"""The server's logic, as each transport calls it."""


def answer_limit(call: Call, handler_timeout: float) -> float:
    """A handler's time: ``handler_timeout``, or nine tenths of the caller's own when that is shorter.

    The API server's deadline (``timeoutSeconds``) covers the whole call:
    answered inside it, a hung handler gets ``on_error``'s answer instead of
    the API server's "context deadline exceeded".
    """
    if call.timeout is None:
        return handler_timeout
    return round(min(handler_timeout, call.timeout * 0.9), 2)
