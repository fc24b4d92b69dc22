"""Why a request got no answer, in words safe to log: no URL, no header, no credential.

aiohttp's and OpenSSL's messages may carry the URL (and so any userinfo) and
request headers; what reaches health records, errors and logs is built here
from fixed words, class names, errno names and OpenSSL reason codes instead,
plus aiohttp's own fixed messages for a request that could not be sent: the
text of an arbitrary error may hold the credential it choked on, so it is never
quoted.
"""

from __future__ import annotations

import asyncio
import os
import ssl
import sys

from .._base.errors import Unreachable


def unexpected(error: Exception, doing: str, method: str, path: str) -> str:
    """Words for an error nobody foresaw: its class and, for the HTTP client's own, its text.

    Only aiohttp's messages and our HTTP/1.1 client's refusals are quoted
    (fixed words such as "Forbidden control character detected in headers",
    naming at most the header); any other error's text might carry the
    credential it choked on, so only its class is named.
    """
    text = ""
    if type(error).__module__.startswith("aiohttp") or "aiohttp" in _raised_in(error) or _ours(error):
        text = str(error).splitlines()[0][:200] if str(error) else ""
    detail = f"{type(error).__name__}: {text}" if text else type(error).__name__
    return f"{doing} {method} {path} failed on our side ({detail}); the server was not asked"


def _ours(error: Exception) -> bool:
    """A refusal of our HTTP/1.1 client (``http1.py``), worded without the value it refused."""
    return isinstance(error, ValueError) and _raised_in(error) == "mcruntime._client.http1"


def _raised_in(error: BaseException) -> str:
    """The module of the innermost frame that raised ``error``."""
    trace = error.__traceback__
    while trace is not None and trace.tb_next is not None:
        trace = trace.tb_next
    return str(trace.tb_frame.f_globals.get("__name__", "")) if trace is not None else ""


def describe_connection_error(error: BaseException) -> str:
    """A short, secret-free description of why no response arrived.

    Built only from fixed words, error class names, errno names and OpenSSL
    reason codes, never from ``str(error)``: aiohttp's messages carry the URL
    (and so any userinfo) and sometimes request headers.
    """
    if isinstance(error, TimeoutError | asyncio.TimeoutError):
        return "timed out waiting for the API server"
    aiohttp = sys.modules.get("aiohttp")  # none of its errors exist until it is imported
    if aiohttp is not None and isinstance(error, aiohttp.ClientConnectorCertificateError):
        certificate_error = error.certificate_error
        reason = getattr(certificate_error, "verify_message", None) or getattr(
            certificate_error, "reason", None
        )
        return f"TLS verification failed: {plain_word(reason) or type(certificate_error).__name__}"
    if aiohttp is not None and isinstance(error, aiohttp.ClientConnectorError):
        return f"cannot connect: {os_reason(error.os_error)}"
    if isinstance(error, ssl.SSLError):
        return f"TLS error: {plain_word(getattr(error, 'reason', None)) or type(error).__name__}"
    if aiohttp is not None and isinstance(error, aiohttp.ClientResponseError):
        return f"{type(error).__name__}: HTTP {error.status}"
    if isinstance(error, OSError):
        return f"{type(error).__name__}: {os_reason(error)}"
    return type(error).__name__


def is_client_error(error: BaseException, name: str = "ClientError") -> bool:
    """Whether ``error`` is aiohttp's ``name`` (a subclass of it included), without importing aiohttp.

    aiohttp is imported only where something needs it (``session.py``); until
    then none of its errors can have been raised.
    """
    aiohttp = sys.modules.get("aiohttp")
    return aiohttp is not None and isinstance(error, getattr(aiohttp, name))


class StreamClosed(ConnectionError):
    """A watch ended before its end: reset, its connection lost, or closed here (``multiplex.py``)."""


def dropped(error: BaseException) -> bool:
    """Whether a watch's error says its connection was dropped, reset or closed by the circuit."""
    return isinstance(error, StreamClosed) or is_client_error(error, "ClientConnectionError")


def os_reason(error: OSError) -> str:
    if error.errno is not None:
        return os.strerror(error.errno)
    return type(error).__name__


def plain_word(value: object) -> str | None:
    """``value`` if it is a short, URL-free phrase (an OpenSSL reason), else ``None``."""
    if not isinstance(value, str) or not value or len(value) > 120:
        return None
    if any(marker in value for marker in ("://", "@", "Authorization", "Bearer")):
        return None
    return value


class Unsendable(Unreachable):
    """The request could not be built or handed to the HTTP client; retrying would not help."""

    def __init__(self, message: str, cluster: str) -> None:
        super().__init__(message, cluster=cluster)


class NoAnswer(Exception):
    """One attempt got no response, and why.

    Whether it surely never reached the server, whether it timed out, and
    whether the server itself is silent (rather than this cluster's TLS
    identity refused).
    """

    def __init__(
        self,
        message: str,
        never_sent: bool,
        timed_out: bool,
        whole_server: bool = False,
        *,
        interrupted: bool = False,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.never_sent = never_sent
        self.timed_out = timed_out
        self.whole_server = whole_server
        self.interrupted = interrupted
        """Ended by the circuit opening: ``message`` is the circuit's reason, which names its request."""
        self.late = 0.0
        """For a timeout: how many seconds after its deadline it fired (our event loop's lag)."""
