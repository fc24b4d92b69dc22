"""Why a request got no answer, in words safe to log: no URL, no header, no credential.

aiohttp's and OpenSSL's messages may carry the URL (and so any userinfo) and
request headers; what reaches health records, errors and logs is built here
from fixed words, class names, errno names and OpenSSL reason codes instead.
"""

from __future__ import annotations

import asyncio
import os
import ssl

import aiohttp


def describe_connection_error(error: BaseException) -> str:
    """A short, secret-free description of why no response arrived.

    Built only from fixed words, error class names, errno names and OpenSSL
    reason codes, never from ``str(error)``: aiohttp's messages carry the URL
    (and so any userinfo) and sometimes request headers.
    """
    if isinstance(error, TimeoutError | asyncio.TimeoutError):
        return "timed out waiting for the API server"
    if isinstance(error, aiohttp.ClientConnectorCertificateError):
        certificate_error = error.certificate_error
        reason = getattr(certificate_error, "verify_message", None) or getattr(
            certificate_error, "reason", None
        )
        return f"TLS verification failed: {plain_word(reason) or type(certificate_error).__name__}"
    if isinstance(error, aiohttp.ClientConnectorError):
        return f"cannot connect: {os_reason(error.os_error)}"
    if isinstance(error, ssl.SSLError):
        return f"TLS error: {plain_word(getattr(error, 'reason', None)) or type(error).__name__}"
    if isinstance(error, aiohttp.ClientResponseError):
        return f"{type(error).__name__}: HTTP {error.status}"
    if isinstance(error, OSError):
        return f"{type(error).__name__}: {os_reason(error)}"
    return type(error).__name__


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
