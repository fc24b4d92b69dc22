"""The header block of a watch's stream, as an HTTP/2 server decodes it.

h2's own normalisation and validation are off for what we send (they cost
7 % of a 10,000-cluster engage), so the block must be valid as built: names
lower-cased, surrounding whitespace stripped (as h2 did), the credential
never indexed, and a value that cannot be sent refused with the header's
name and without its value.
"""

from __future__ import annotations

import asyncio
from typing import Any

import h2.config
import h2.connection
import h2.events
import pytest
from hpack import NeverIndexedHeaderTuple

from mcruntime._client.multiplex import _Channel, request_headers

TOKEN = "eyJhbGciOiJSUzI1NiJ9.a-token.signature"


class _Transport(asyncio.Transport):
    """Collects what the channel writes; says ALPN chose h2."""

    def __init__(self) -> None:
        super().__init__()
        self.written = bytearray()

    def write(self, data: Any) -> None:
        self.written += data

    def is_closing(self) -> bool:
        return False

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        if name == "ssl_object":
            return type("Tls", (), {"selected_alpn_protocol": staticmethod(lambda: "h2")})()
        return default


async def test_the_server_decodes_a_valid_block_with_the_credential_never_indexed() -> None:
    channel = _Channel(owner=None)  # type: ignore[arg-type]  # the owner is not asked while opening
    transport = _Transport()
    channel.connection_made(transport)
    block = request_headers(
        [
            (b":method", b"GET"),
            (b":scheme", b"https"),
            (b":authority", b"127.0.0.1:6443"),
            (b":path", b"/api"),
        ],
        {"Accept": "application/json", "Authorization": f"Bearer {TOKEN}"},
    )
    channel.open_stream(block, read_timeout=None)
    server = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False, header_encoding=None))
    server.initiate_connection()
    events = server.receive_data(bytes(transport.written))  # the server validates what it receives
    [request] = [event for event in events if isinstance(event, h2.events.RequestReceived)]
    assert request.headers is not None
    received = {bytes(name): header for header in request.headers for name in [header[0]]}
    assert received[b"authorization"][1] == f"Bearer {TOKEN}".encode()
    assert isinstance(received[b"authorization"], NeverIndexedHeaderTuple)
    assert not isinstance(received[b"accept"], NeverIndexedHeaderTuple)
    assert received[b":path"][1] == b"/api"


@pytest.mark.parametrize("value", ["Bearer a\r\nX-Injected: 1", "Bearer a\x00b", "Bearer a\nb"])
def test_a_value_that_cannot_be_sent_is_refused_by_name(value: str) -> None:
    with pytest.raises(ValueError, match="header 'Authorization'") as raised:
        request_headers([], {"Authorization": value})
    assert "Bearer" not in str(raised.value)


def test_surrounding_whitespace_is_stripped_as_h2_and_http_1_1_servers_do() -> None:
    block = request_headers([], {"Authorization": " Bearer a \t"})
    assert block[-1] == (b"authorization", b"Bearer a")  # coded never indexed when sent (see above)
