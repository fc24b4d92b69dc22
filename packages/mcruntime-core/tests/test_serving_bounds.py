"""The manager's endpoint server (/healthz, /readyz, /metrics) under hostile clients: idle
connections time out, the connection count is capped without locking probes out, malformed
requests do not flood the log, and two port-0 addresses get a port each. No cluster needed."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from collections.abc import AsyncIterator

import pytest
from prometheus_client import CollectorRegistry

from mcruntime._manager.serving import Checks, Endpoints
from mcruntime.testing import wait_until

Stream = tuple[asyncio.StreamReader, asyncio.StreamWriter]


@contextlib.asynccontextmanager
async def serving(
    readyz: Checks | None = None, *, idle_timeout: float = 60.0, max_connections: int = 256
) -> AsyncIterator[Endpoints]:
    endpoints = Endpoints(
        Checks(),
        readyz or Checks(),
        CollectorRegistry(),
        idle_timeout=idle_timeout,
        max_connections=max_connections,
    )
    await endpoints.start(probes="127.0.0.1:0", metrics=None)
    try:
        yield endpoints
    finally:
        await endpoints.stop()


@contextlib.asynccontextmanager
async def clients() -> AsyncIterator[list[Stream]]:
    """The connections a test opens, closed at its end whatever the server did with them."""
    streams: list[Stream] = []
    try:
        yield streams
    finally:
        for _reader, writer in streams:
            writer.close()
        for _reader, writer in streams:
            with contextlib.suppress(OSError):
                await writer.wait_closed()


async def connect(endpoints: Endpoints, streams: list[Stream], first: bytes = b"") -> Stream:
    stream = await asyncio.open_connection(*endpoints.addresses["/healthz"])
    streams.append(stream)
    if first:
        stream[1].write(first)
        with contextlib.suppress(ConnectionError):  # a server that refuses may have reset it already
            await stream[1].drain()
    return stream


def closed(stream: Stream) -> bool:
    """Whether the server closed this connection (a reset counts)."""
    reader = stream[0]
    return reader.at_eof() or reader.exception() is not None


async def answer(stream: Stream) -> bytes:
    """All the server sends until it closes; empty when it closed without answering."""
    try:
        return await asyncio.wait_for(stream[0].read(), 10)
    except ConnectionResetError:
        return b""


def request(path: str) -> bytes:
    return f"GET {path} HTTP/1.1\r\nHost: probe\r\nConnection: close\r\n\r\n".encode()


async def get(endpoints: Endpoints, path: str = "/healthz") -> bytes:
    async with clients() as streams:
        return await answer(await connect(endpoints, streams, request(path)))


def cap_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        record.getMessage()
        for record in caplog.records
        if record.name == "mcruntime.serving" and "at its cap" in record.getMessage()
    ]


async def test_idle_and_half_sent_connections_are_closed_after_the_idle_timeout() -> None:
    async with serving(idle_timeout=0.2) as endpoints, clients() as streams:
        idle = [await connect(endpoints, streams) for _ in range(40)]
        half = await connect(endpoints, streams, b"GET /healthz HTTP/1.1\r\nHost: pro")
        used = await connect(endpoints, streams, b"GET /healthz HTTP/1.1\r\nHost: probe\r\n\r\n")
        assert (await used[0].readuntil(b"ok")).startswith(b"HTTP/1.1 200")
        # `used` now idles on keep-alive: aiohttp's timer; the others never sent a whole request.
        await wait_until(
            lambda: all(closed(stream) for stream in [*idle, half, used]),
            timeout=10,
            what="every idle connection closed by the server",
        )
        assert (await get(endpoints)).startswith(b"HTTP/1.1 200")


async def test_at_the_cap_a_new_client_displaces_the_longest_idle_connection(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    async with serving(max_connections=8) as endpoints:
        port = endpoints.addresses["/healthz"][1]
        async with clients() as streams:
            idle = [await connect(endpoints, streams) for _ in range(20)]
            await wait_until(
                lambda: sum(closed(stream) for stream in idle) == 12,
                timeout=10,
                what="12 of 20 idle connections closed at a cap of 8",
            )
            assert (await get(endpoints)).startswith(b"HTTP/1.1 200")
            await wait_until(lambda: sum(closed(stream) for stream in idle) == 13, timeout=10)
            assert sum(closed(stream) for stream in idle) == 13
            assert not any(closed(stream) for stream in idle[-7:])
            lines = cap_lines(caplog)
            assert len(lines) == 1, lines
            assert f"on 127.0.0.1:{port} is at its cap of 8 connections" in lines[0]
    # The rest is reported when the server stops.
    counts = [int(re.findall(r"(\d+) idle closed", line)[0]) for line in cap_lines(caplog)]
    assert sum(counts) == 13


async def test_past_the_cap_a_new_connection_is_refused_while_all_are_in_a_request(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    gate = asyncio.Event()
    entered = 0

    async def held() -> None:
        nonlocal entered
        entered += 1
        await gate.wait()

    readyz = Checks()
    readyz.add("held", held)
    async with serving(readyz, max_connections=4) as endpoints, clients() as streams:
        try:
            busy = [await connect(endpoints, streams, request("/readyz")) for _ in range(4)]
            await wait_until(lambda: entered == 4, timeout=10, what="4 requests in the handler")
            extra = [await connect(endpoints, streams, request("/healthz")) for _ in range(6)]
            assert [await answer(stream) for stream in extra] == [b""] * 6
        finally:
            gate.set()  # or the server's stop waits on the held requests
        for stream in busy:
            assert (await answer(stream)).startswith(b"HTTP/1.1 200")
        assert (await get(endpoints)).startswith(b"HTTP/1.1 200")
    lines = cap_lines(caplog)
    assert sum(int(re.findall(r"(\d+) new refused", line)[0]) for line in lines) == 6, lines


MALFORMED = [
    b"GET /healthz\x01 HTTP/1.1\r\nHost: x\r\n\r\n",
    b"GET /healthz HTTP/1.1\r\nno colon here\r\n\r\n",
    b"GET /healthz HTTP/9.9\r\nHost: x\r\n\r\n",
    b"GET /healthz HTTP/1.1\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n",
    b"\x16\x03\x01\x00\xa5\x01\x00\x00\xa1\x03\x03" + b"\x00" * 32 + b"\r\n\r\n",
    b"GET /" + b"a" * 10_000 + b" HTTP/1.1\r\n\r\n",
    b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + b"X-Big: " + b"b" * 10_000 + b"\r\n\r\n",
    b"FOO\x01 /healthz HTTP/1.1\r\n\r\n",
]


async def test_malformed_requests_get_a_4xx_and_no_error_or_traceback_in_the_log(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    async with serving() as endpoints:
        for number in range(200):
            async with clients() as streams:
                reply = await answer(await connect(endpoints, streams, MALFORMED[number % len(MALFORMED)]))
            assert re.match(rb"HTTP/1\.[01] 4\d\d ", reply), (number, reply[:80])
        assert (await get(endpoints)).startswith(b"HTTP/1.1 200")
    loud = [record for record in caplog.records if record.levelno >= logging.WARNING]
    assert not loud, [record.getMessage() for record in loud]
    assert not [record for record in caplog.records if record.exc_info or record.exc_text]
    assert "Traceback" not in caplog.text
    quiet = [record for record in caplog.records if record.name == "mcruntime.serving.http"]
    assert 0 < len(quiet) <= 200
    assert all("malformed request from 127.0.0.1" in record.getMessage() for record in quiet)


async def test_malformed_requests_log_nothing_unless_debug_is_on(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    async with serving() as endpoints:
        for request_bytes in MALFORMED:
            async with clients() as streams:
                assert (await answer(await connect(endpoints, streams, request_bytes))).startswith(b"HTTP/1.")
    said = [(record.name, record.getMessage()) for record in caplog.records]
    assert [line for line in said if not line[1].startswith("serving /healthz")] == []


async def test_two_addresses_with_port_0_get_a_port_each() -> None:
    endpoints = Endpoints(Checks(), Checks(), CollectorRegistry())
    await endpoints.start(probes="127.0.0.1:0", metrics="127.0.0.1:0")
    try:
        probes, metrics = endpoints.addresses["/healthz"], endpoints.addresses["/metrics"]
        assert probes[1] != metrics[1] and 0 not in (probes[1], metrics[1])
        assert endpoints.addresses["/readyz"] == probes
        assert (await get(endpoints)).startswith(b"HTTP/1.1 200")
        async with clients() as streams:
            stream = await asyncio.open_connection(*metrics)
            streams.append(stream)
            stream[1].write(request("/metrics"))
            assert (await answer(stream)).startswith(b"HTTP/1.1 200")
            stream = await asyncio.open_connection(*metrics)
            streams.append(stream)
            stream[1].write(request("/healthz"))
            assert (await answer(stream)).startswith(b"HTTP/1.1 404")
    finally:
        await endpoints.stop()
