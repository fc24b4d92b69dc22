"""Loopback ports and small synchronous HTTP probes for the testbed.

The testbed talks to its own processes synchronously so that it holds no event
loop state: one fleet can then serve tests that each run in their own loop.
"""

from __future__ import annotations

import http.client
import json
import socket
import ssl
from typing import Any

LOOPBACK = "127.0.0.1"


def free_port() -> int:
    """A port that was free a moment ago; callers retry if they lose the race."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((LOOPBACK, 0))
        return int(probe.getsockname()[1])


def http_get(port: int, path: str, timeout: float = 2.0) -> tuple[int, bytes] | None:
    """Plain-HTTP GET on loopback; ``None`` when nothing answers."""
    connection = http.client.HTTPConnection(LOOPBACK, port, timeout=timeout)
    try:
        connection.request("GET", path)
        response = connection.getresponse()
        return response.status, response.read()
    except OSError:
        return None
    finally:
        connection.close()


def https_request(
    port: int,
    method: str,
    path: str,
    context: ssl.SSLContext,
    *,
    body: Any = None,
    token: str | None = None,
    timeout: float = 5.0,
) -> tuple[int, Any] | None:
    """HTTPS request with a JSON body and reply; ``None`` when nothing answers.

    Raises:
        ssl.SSLCertVerificationError: the server answered with a certificate that
            does not verify; unlike a refused connection, retrying cannot help.
    """
    headers = {"Accept": "application/json"}
    payload = None
    if body is not None:
        payload = json.dumps(body).encode()
        headers["Content-Type"] = "application/json"
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    connection = http.client.HTTPSConnection(LOOPBACK, port, timeout=timeout, context=context)
    try:
        connection.request(method, path, body=payload, headers=headers)
        response = connection.getresponse()
        raw = response.read()
    except ssl.SSLCertVerificationError:
        raise  # a certificate this Python rejects: no waiting fixes that, the caller says why
    except OSError:
        return None
    finally:
        connection.close()
    try:
        return response.status, json.loads(raw) if raw else None
    except json.JSONDecodeError:
        return response.status, raw.decode(errors="replace")
