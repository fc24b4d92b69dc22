"""Our HTTP/1.1 paths against an API server that means harm: answers that never end, redirects.

From an outside review against hostile servers. A header value that never
ends was never seen by the per-header bound (the parser hands a header over
only once its value ends, copying the value on every read meanwhile) and
stalled the event loop; a body that never ends was read to 1 GiB and then
asked for again, five times; over HTTP/1.1 a watch followed a redirect to
another origin, plain HTTP included, and yielded what it sent as an event.
Each server here is TLS on 127.0.0.1 with a throwaway CA, offering HTTP/1.1
only (so watches go through aiohttp), and sends a bounded amount: a client
without the bound sees the connection close instead, which fails the test
rather than hanging it. The bounds are lowered so each test takes moments.
"""

from __future__ import annotations

import asyncio
import base64
import json
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from kube_helpers import FAKE_DISCOVERY

import mcruntime as mcr
from mcruntime._client import http1, tls_socket, transport
from mcruntime._client.http1 import AnswerTooLarge, RequestPool
from mcruntime.testing import wait_until
from mcruntime.testing._pki import CertificateAuthority

CONFIGMAP = mcr.Kind("v1", "ConfigMap")
LIST_PATH = "/api/v1/namespaces/default/configmaps"
TOKEN = "t0ken-n0t-t0-be-seen"
SENT = 4 << 20
"""How much of a never-ending answer each server sends before it closes: many times each lowered bound."""
OPTIONS = mcr.ClusterOptions(retry=mcr.RetryPolicy(attempts=3, base_delay=0.01))
"""Retries that would show (and quickly) if an answer refused for its size were asked for again."""


Route = Callable[[str, str, asyncio.StreamWriter], Awaitable[bool]]
"""Given a request's method and target (discovery aside), write an answer; ``False`` closes the connection."""


class Hostile:
    """A TLS server that answers discovery as a real one does and everything else as ``route`` says."""

    def __init__(self, route: Route) -> None:
        self.route = route
        self.requests: list[tuple[str, str]] = []
        self.writers: set[asyncio.StreamWriter] = set()
        self.url = ""

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.writers.add(writer)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                method, target, _ = head.split(b"\r\n", 1)[0].decode("latin-1").split(" ", 2)
                self.requests.append((method, target))
                known = FAKE_DISCOVERY.get(target.split("?")[0])
                if known is not None:
                    body = json.dumps(known).encode()
                    writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
                elif not await self.route(method, target, writer):
                    break
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, ssl.SSLError):
            pass
        finally:
            writer.transport.abort()
            self.writers.discard(writer)

    def lists(self) -> list[str]:
        return [target for method, target in self.requests if target.startswith(LIST_PATH)]

    def config(self, ca: CertificateAuthority) -> mcr.ClusterConfig:
        return mcr.kubeconfig_from_dict(
            {
                "clusters": [
                    {
                        "name": "c",
                        "cluster": {
                            "server": self.url,
                            "certificate-authority-data": base64.b64encode(ca.cert_pem).decode(),
                        },
                    }
                ],
                "users": [{"name": "u", "user": {"token": TOKEN}}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        )


@pytest.fixture(scope="module")
def ca() -> CertificateAuthority:
    return CertificateAuthority("hostile-http1")


@asynccontextmanager
async def hostile(route: Route, ca: CertificateAuthority, tmp_path: Path) -> AsyncIterator[Hostile]:
    pair = ca.issue("hostile", server_hosts=("127.0.0.1",))
    (tmp_path / "tls.crt").write_bytes(pair.cert_pem)
    (tmp_path / "tls.key").write_bytes(pair.key_pem)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(tmp_path / "tls.crt", tmp_path / "tls.key")
    context.set_alpn_protocols(["http/1.1"])  # no h2: watches go through aiohttp
    server = Hostile(route)
    listener = await asyncio.start_server(server.handle, "127.0.0.1", 0, ssl=context)
    server.url = f"https://127.0.0.1:{listener.sockets[0].getsockname()[1]}"
    async with listener:
        yield server
        for writer in list(server.writers):
            writer.transport.abort()
        await wait_until(lambda: not server.writers, what="the hostile server's handlers done")


def endless(start: bytes, piece: bytes) -> Route:
    """An answer that starts with ``start`` and goes on with ``piece`` (until :data:`SENT`, then closes)."""

    async def route(_method: str, _target: str, writer: asyncio.StreamWriter) -> bool:
        writer.write(start)
        for _ in range(SENT // len(piece)):
            writer.write(piece)
            await writer.drain()
        return False

    return route


def chunk(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


@pytest.fixture
def small_bounds(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(http1, "MAX_HEADER_BYTES", 16 * 1024)
    monkeypatch.setattr(http1, "HEAD_FRAMING_BYTES", 1024)
    monkeypatch.setattr(http1, "MAX_BODY_BYTES", 1 << 20)


async def _fed_until_refused(
    start: bytes, refusal: str, ca: CertificateAuthority, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> list[int]:
    """The sizes of what the parser was fed of an answer that starts with ``start`` and never ends."""
    fed: list[int] = []
    feed = http1._Connection._feed

    def counted(self: http1._Connection, data: bytes) -> bool:
        fed.append(len(data))
        return feed(self, data)

    monkeypatch.setattr(http1._Connection, "_feed", counted)
    async with hostile(endless(start, b"a" * 4096), ca, tmp_path) as server:
        pool = RequestPool(server.url, ssl.create_default_context(cadata=ca.cert_pem.decode()))
        try:
            with pytest.raises(AnswerTooLarge, match=refusal):
                await pool.request("GET", LIST_PATH, None, {}, None, 5.0)
        finally:
            pool.close()
    return fed


@pytest.mark.parametrize(
    "start",
    [b"HTTP/1.1 200 OK\r\nX-Short: 1\r\nX-Long: ", b"HTTP/1.1 200 "],
    ids=["header-value", "status-line"],
)
@pytest.mark.usefixtures("small_bounds")
async def test_a_head_that_never_ends_is_refused_at_the_bound_before_the_parser_sees_more(
    start: bytes, ca: CertificateAuthority, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fed = await _fed_until_refused(start, "over 16 KiB of headers", ca, tmp_path, monkeypatch)
    # The parser copies an unfinished value on each read: it must never hold more than the bound.
    assert sum(fed) <= http1.MAX_HEADER_BYTES + http1.HEAD_FRAMING_BYTES


CHUNKED = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"


@pytest.mark.parametrize(
    "start",
    [CHUNKED + chunk(b"{}") + b"0\r\nX-Trailer: ", CHUNKED + b"2;ext="],
    ids=["trailer-value", "chunk-extension"],
)
@pytest.mark.usefixtures("small_bounds")
async def test_bytes_after_the_head_that_never_make_progress_are_refused_within_a_read_of_the_bound(
    start: bytes, ca: CertificateAuthority, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Found by a review: after the head nothing was counted, and a trailer whose value never
    # ended cost the loop time quadratic in its length (18 MiB: 1.6 s) and memory without end.
    fed = await _fed_until_refused(
        start, "over 17 KiB after its head that are neither body", ca, tmp_path, monkeypatch
    )
    bound = http1.MAX_HEADER_BYTES + http1.HEAD_FRAMING_BYTES
    assert sum(fed) <= len(start) + bound + tls_socket._READ_SIZE, fed


@pytest.mark.usefixtures("small_bounds")
async def test_a_chunked_answer_with_trailers_and_tiny_chunks_is_answered(
    ca: CertificateAuthority, tmp_path: Path
) -> None:
    body = b"0123456789" * 4_000  # 40,000 chunks of one byte: framing far past the bound, body all along

    async def route(_method: str, _target: str, writer: asyncio.StreamWriter) -> bool:
        writer.write(CHUNKED + b"".join(chunk(body[i : i + 1]) for i in range(len(body))))
        writer.write(b"0\r\nX-Trailer: " + b"t" * 8_000 + b"\r\n\r\n")
        return True

    async with hostile(route, ca, tmp_path) as server:
        pool = RequestPool(server.url, ssl.create_default_context(cadata=ca.cert_pem.decode()))
        try:
            status, _headers, answer = await pool.request("GET", LIST_PATH, None, {}, None, 5.0)
        finally:
            pool.close()
    assert (status, answer) == (200, body)


@pytest.mark.usefixtures("small_bounds")
async def test_a_head_within_the_bound_read_in_one_piece_with_its_body_is_answered(
    ca: CertificateAuthority, tmp_path: Path
) -> None:
    body = b"b" * 60_000  # past the head's room, in the same reads as the head's end

    async def route(_method: str, _target: str, writer: asyncio.StreamWriter) -> bool:
        head = b"HTTP/1.1 200 OK\r\nX-Long: " + b"h" * 15_000 + b"\r\nContent-Length: %d\r\n\r\n" % len(body)
        writer.write(head + body)
        return True

    async with hostile(route, ca, tmp_path) as server:
        pool = RequestPool(server.url, ssl.create_default_context(cadata=ca.cert_pem.decode()))
        try:
            for _ in range(2):  # and the head of the next answer on the connection is counted anew
                status, headers, answer = await pool.request("GET", LIST_PATH, None, {}, None, 5.0)
                assert (status, len(headers["x-long"]), answer) == (200, 15_000, body)
            assert pool.connections == 1
        finally:
            pool.close()


@pytest.mark.parametrize(
    "route",
    [
        endless(b"HTTP/1.1 200 OK\r\nX-Long: ", b"a" * 4096),
        endless(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n", chunk(b" " * 4096)),
    ],
    ids=["endless-header", "endless-chunked-body"],
)
@pytest.mark.usefixtures("small_bounds")
async def test_an_answer_refused_for_its_size_is_not_asked_for_again_and_names_cluster_request_and_bound(
    route: Route, ca: CertificateAuthority, tmp_path: Path
) -> None:
    async with (
        hostile(route, ca, tmp_path) as server,
        mcr.Cluster("hostile", server.config(ca), OPTIONS) as cluster,
    ):
        with pytest.raises(mcr.APIError) as raised:
            await cluster.client.list(CONFIGMAP, namespace="default")
        health = cluster.health
    error = raised.value
    assert not isinstance(error, mcr.Unreachable)  # the server answered: too much, not nothing
    assert error.cluster == "hostile" and error.reason == "AnswerTooLarge"
    assert f"GET {LIST_PATH}" in str(error)
    assert "over 16 KiB of headers" in str(error) or "over 1 MiB" in str(error)
    assert len(server.lists()) == 1
    assert health.last_error is not None and "not asked again" in health.last_error


def test_the_body_bound_is_far_below_a_gibibyte() -> None:
    # A page of 500 objects is rarely over a few tens of MiB; an endless body costs this once.
    assert http1.MAX_BODY_BYTES <= 256 << 20


@asynccontextmanager
async def collector() -> AsyncIterator[tuple[int, list[bytes]]]:
    """A plain-HTTP server a redirect points to: its port, and what it was asked (nothing, if none is followed)."""
    seen: list[bytes] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            seen.append(await reader.readuntil(b"\r\n\r\n"))
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nConnection: close\r\n\r\n{}\n")
            await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    listener = await asyncio.start_server(handle, "127.0.0.1", 0)
    async with listener:
        yield listener.sockets[0].getsockname()[1], seen


async def test_a_redirect_is_never_followed_and_names_only_the_origin_it_pointed_to(
    ca: CertificateAuthority, tmp_path: Path
) -> None:
    async with collector() as (port, seen):

        async def route(_method: str, _target: str, writer: asyncio.StreamWriter) -> bool:
            where = f"http://127.0.0.1:{port}/steal?secret=s3cret-path"
            writer.write(
                f"HTTP/1.1 307 Temporary Redirect\r\nLocation: {where}\r\nContent-Length: 0\r\n\r\n".encode()
            )
            return True

        async with (
            hostile(route, ca, tmp_path) as server,
            mcr.Cluster("redirect", server.config(ca)) as cluster,
        ):
            errors: list[mcr.APIError] = []
            with pytest.raises(mcr.APIError) as raised:
                await cluster.client.list(CONFIGMAP, namespace="default")
            errors.append(raised.value)
            watch = cluster.client.watch(CONFIGMAP, namespace="default")
            with pytest.raises(mcr.APIError) as raised:
                async with asyncio.timeout(30):  # a deadline, should the watch follow and then wait
                    await anext(watch)
            errors.append(raised.value)
            with pytest.raises(mcr.APIError) as raised:  # HEAD goes through aiohttp too
                await cluster.transport.request("HEAD", LIST_PATH)
            errors.append(raised.value)
        assert seen == []  # nothing reached the other origin
    for error in errors:
        text = str(error)
        assert error.cluster == "redirect" and error.status == 307, text
        assert f"a redirect to http://127.0.0.1:{port}" in text and "not followed" in text, text
        assert "steal" not in text and "s3cret" not in text and TOKEN not in text, text


@pytest.mark.parametrize(
    ("location", "told"),
    [
        ("/elsewhere?token=x", "https://api.example:6443"),
        ("HTTP://user:pa55@Evil.example/steal", "http://evil.example:80"),
        ("https://[::1]:8443/x", "https://[::1]:8443"),
        ("ftp://evil.example/x", "a Location that is no http(s) URL"),
        ("http://[::1/x", "an unreadable Location"),
        (None, "nowhere (no Location)"),
    ],
)
def test_a_redirect_is_named_by_its_origin_alone(location: str | None, told: str) -> None:
    assert transport._origin("https://api.example:6443/prefix", location) == told
