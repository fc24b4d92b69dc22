"""One webhook call as the server's logic sees it, whichever protocol carried it.

The API server calls over HTTP/2 when the webhook offers it, and over
HTTP/1.1 otherwise (or when told to). Both transports turn a request into a
:class:`Call` and send back the :class:`Reply` the logic returns, so routing,
limits and every error's wording are the same on both.
"""

from __future__ import annotations

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


Serve = Callable[[Call], Awaitable[Reply]]
"""The server's logic, as each transport calls it."""
