"""Our HTTP/1.1 request client (``_client/http1.py``) against servers that answer what the test scripts.

A real API server answers well-formed HTTP (the cluster tests send every
request through this client); these servers answer what one must not trust:
bytes that are no HTTP, headers and bodies past the bounds, gzip bombs,
connections closed before the answer. Each must fail the request with
words that name the problem, never hang it, and never reuse the connection.
"""

from __future__ import annotations

import asyncio
import gzip
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import pytest

from mcruntime import Unreachable
from mcruntime._client import http1
from mcruntime._client.http1 import RequestFailed, RequestPool
from mcruntime._client.session import ServerSession
from mcruntime.testing import wait_until

Answerer = Callable[[bytes, asyncio.StreamWriter], Awaitable[bool]]
"""Given a request's head, write an answer; ``False`` closes the connection."""


def answer(status: int, body: bytes = b"", headers: dict[str, str] | None = None) -> bytes:
    lines = [f"HTTP/1.1 {status} X\r\n", f"Content-Length: {len(body)}\r\n"]
    lines += [f"{name}: {value}\r\n" for name, value in (headers or {}).items()]
    return "".join(lines).encode() + b"\r\n" + body


class Server:
    """A local HTTP server: what it was sent, and how many connections it saw."""

    def __init__(self, answerer: Answerer) -> None:
        self.answerer = answerer
        self.requests: list[bytes] = []
        self.connections = 0
        self.url = ""
        self.writers: set[asyncio.StreamWriter] = set()

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self.writers.add(writer)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(
                    (
                        int(line.split(b":")[1])
                        for line in head.split(b"\r\n")
                        if line.lower().startswith(b"content-length")
                    ),
                    0,
                )
                self.requests.append(head + await reader.readexactly(length))
                if not await self.answerer(head, writer):
                    break
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()
            self.writers.discard(writer)


@asynccontextmanager
async def serving(answerer: Answerer) -> AsyncIterator[Server]:
    server = Server(answerer)
    listener = await asyncio.start_server(server.handle, "127.0.0.1", 0)
    port = listener.sockets[0].getsockname()[1]
    server.url = f"http://127.0.0.1:{port}"
    async with listener:
        yield server
        for writer in list(server.writers):  # handlers end on their own, none is left to be cancelled
            writer.close()
        await wait_until(lambda: not server.writers, what="the test server's handlers done")


def replying(data: bytes, keep: bool = True) -> Answerer:
    async def answerer(_head: bytes, writer: asyncio.StreamWriter) -> bool:
        writer.write(data)
        return keep

    return answerer


async def test_requests_reuse_one_kept_alive_connection() -> None:
    async with serving(replying(answer(200, b'{"a": 1}', {"Retry-After": "3"}))) as server:
        pool = RequestPool(server.url, None)
        for _ in range(3):
            status, headers, body = await pool.request("GET", "/api/v1/x", None, {"Accept": "a/b"}, None, 5.0)
            assert (status, body, headers["retry-after"], headers.get("RETRY-AFTER")) == (
                200,
                b'{"a": 1}',
                "3",
                "3",
            )
        assert server.connections == 1 and pool.connections == 1
        pool.close()
        assert pool.connections == 0


async def test_a_request_is_written_with_its_path_quoted_query_encoded_and_body_counted() -> None:
    async with serving(replying(answer(201))) as server:
        pool = RequestPool(server.url + "/prefix/", None, user_agent="ua")
        params = {"labelSelector": "a in (x,y)", "limit": "5"}
        await pool.request("PATCH", "/api/v1/odd name?#", params, {"Content-Type": "c/d"}, b"{}", 5.0)
        pool.close()
    sent = server.requests[0].decode()
    first, *rest = sent.split("\r\n")
    assert first == "PATCH /prefix/api/v1/odd%20name%3F%23?labelSelector=a+in+%28x%2Cy%29&limit=5 HTTP/1.1"
    assert {"Content-Type: c/d", "Content-Length: 2", "User-Agent: ua", "Accept-Encoding: gzip"} <= set(rest)
    assert sent.endswith("\r\n\r\n{}")


async def test_a_header_with_a_line_break_is_refused_before_anything_is_sent() -> None:
    async with serving(replying(answer(200))) as server:
        pool = RequestPool(server.url, None)
        with pytest.raises(ValueError, match="'Authorization' header") as caught:
            await pool.request("GET", "/", None, {"Authorization": "Bearer x\r\nEvil: 1"}, None, 5.0)
        assert "Bearer" not in str(caught.value)
        with pytest.raises(ValueError, match="outside ASCII in the 'Authorization' header") as caught:
            await pool.request("GET", "/", None, {"Authorization": "Bearer s€cret"}, None, 5.0)
        assert "€" not in str(caught.value) and caught.value.__context__ is None
        assert server.connections == 0
        pool.close()


async def test_chunked_and_gzip_answers_are_decoded() -> None:
    document = b'{"items": []}' * 1000
    packed = gzip.compress(document)
    half = len(packed) // 2
    chunked = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Encoding: gzip\r\n\r\n"
    for chunk in (packed[:half], packed[half:]):
        chunked += f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n"
    chunked += b"0\r\n\r\n"
    async with serving(replying(chunked)) as server:
        pool = RequestPool(server.url, None)
        assert (await pool.request("GET", "/", None, {}, None, 5.0))[2] == document
        assert (await pool.request("GET", "/", None, {}, None, 5.0))[2] == document
        assert server.connections == 1
        pool.close()


async def test_connection_close_is_honoured() -> None:
    async with serving(replying(answer(200, b"x", {"Connection": "close"}), keep=False)) as server:
        pool = RequestPool(server.url, None)
        for _ in range(2):
            assert (await pool.request("GET", "/", None, {}, None, 5.0))[0] == 200
        assert server.connections == 2
        pool.close()


@pytest.mark.parametrize(
    ("reply", "words"),
    [
        (b"SSH-2.0-OpenSSH_9.2\r\n", "not valid HTTP/1.1"),
        (
            b"HTTP/1.1 200 OK\r\nX: " + b"y" * (http1.MAX_HEADER_BYTES + 1) + b"\r\n\r\n",
            "over 256 KiB of headers",
        ),
        (answer(200, b"x", {"Content-Encoding": "br"}), "an encoding not asked for ('br')"),
        (answer(200, b"not gzip", {"Content-Encoding": "gzip"}), "gzip body is corrupt"),
        (answer(200, b"abc")[:-1], "closed the connection before answering"),
        (b"", "closed the connection before answering"),
    ],
    ids=["not-http", "huge-headers", "unknown-encoding", "corrupt-gzip", "cut-body", "closed"],
)
async def test_a_hostile_or_broken_answer_fails_the_request_and_its_connection(
    reply: bytes, words: str
) -> None:
    async with serving(replying(reply, keep=False)) as server:
        pool = RequestPool(server.url, None)
        with pytest.raises(RequestFailed, match=words.replace("(", r"\(").replace(")", r"\)")) as caught:
            await pool.request("GET", "/", None, {}, None, 5.0)
        assert not caught.value.never_sent  # it was sent: only idempotent requests may retry
        await wait_until(lambda: pool.connections == 0, what="the broken connection dropped")
        pool.close()


async def test_a_second_answer_to_one_request_drops_the_connection() -> None:
    async with serving(replying(answer(200, b"one") + answer(200, b"two"))) as server:
        pool = RequestPool(server.url, None)
        assert (await pool.request("GET", "/", None, {}, None, 5.0))[2] == b"one"
        # Not reused: its next answer would be the extra one. (Both answers left in one write, so
        # they arrive together and the connection is dropped before the request returns.)
        assert pool.connections == 0
        assert (await pool.request("GET", "/", None, {}, None, 5.0))[2] == b"one"
        assert server.connections == 2
        pool.close()


async def test_bodies_past_the_bound_are_refused_before_and_after_decompression(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(http1, "MAX_BODY_BYTES", 1000)
    bomb = gzip.compress(b"0" * 100_000)  # a few hundred bytes that decompress to 100 kB
    assert len(bomb) < 1000
    for reply, words in (
        (answer(200, b"x" * 1001), "over 0 MiB"),
        (answer(200, bomb, {"Content-Encoding": "gzip"}), "once decompressed"),
    ):
        async with serving(replying(reply)) as server:
            pool = RequestPool(server.url, None)
            with pytest.raises(RequestFailed, match=words):
                await pool.request("GET", "/", None, {}, None, 5.0)
            pool.close()


async def test_a_refused_connection_was_never_sent() -> None:
    listener = await asyncio.start_server(lambda _r, _w: None, "127.0.0.1", 0)
    port = listener.sockets[0].getsockname()[1]
    listener.close()
    await listener.wait_closed()
    pool = RequestPool(f"http://127.0.0.1:{port}", None)
    with pytest.raises(RequestFailed, match="cannot connect: Connection refused") as caught:
        await pool.request("POST", "/", None, {}, b"{}", 5.0)
    assert caught.value.never_sent and not caught.value.tls
    pool.close()


async def test_a_cancelled_request_drops_its_connection_and_idle_ones_expire() -> None:
    silent = asyncio.Event()

    async def hang_the_second(head: bytes, writer: asyncio.StreamWriter) -> bool:
        if b"/hang" in head:
            await silent.wait()
        writer.write(answer(200))
        return True

    async with serving(hang_the_second) as server:
        pool = RequestPool(server.url, None, keepalive=0.05)
        await pool.request("GET", "/", None, {}, None, 5.0)
        await wait_until(lambda: pool.connections == 0, what="the idle connection closed after its keepalive")
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.2):
                await pool.request("GET", "/hang", None, {}, None, 5.0)
        assert pool.connections == 0  # its state is unknown: never reused
        silent.set()
        assert (await pool.request("GET", "/", None, {}, None, 5.0))[0] == 200
        assert server.connections == 3
        pool.close()


def test_a_server_url_without_a_host_is_refused_and_a_unicode_one_is_spelled_for_dns() -> None:
    with pytest.raises(ValueError, match="https://host"):
        RequestPool("https://", None)
    assert "xn--bcher-kva.example:6443" in repr(RequestPool("https://bücher.example:6443", None))


async def test_a_closed_session_refuses_aiohttp_requests_instead_of_making_a_session() -> None:
    """A caller that reaches a closed session must not get an aiohttp session nobody would close."""
    session = ServerSession("https://127.0.0.1:1", ssl.create_default_context(), {})
    await session.close()
    with pytest.raises(Unreachable, match="the cluster was stopped") as caught:
        session.http("c1")
    assert caught.value.cluster == "c1"
    assert "aiohttp=False" in repr(session)
