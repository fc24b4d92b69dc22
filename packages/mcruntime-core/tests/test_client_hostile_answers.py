"""Answers no API server gives are named errors, and a refusal never quotes our credential.

A fake API server (TLS on loopback, HTTP/1.1 only, just enough discovery for a
Cluster) answers each test's requests the way a broken or hostile one would:
continue tokens that never end, HTML with a 200, watch lines that are not
events, a 401 that echoes the bearer token it was sent.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import orjson
import pytest
from kube_helpers import FAKE_DISCOVERY

import mcruntime as mcr
from mcruntime._client import answers
from mcruntime.cache import Informer
from mcruntime.testing import wait_until
from mcruntime.testing._pki import CertificateAuthority

TOKEN = "hostile-test-token-6f1c2b9a8d7e4c3b2a19"
CONFIGMAP = mcr.Kind("v1", "ConfigMap")

# The test's answer to one request: (status, body) or, for a watch, the lines of its stream.
Answer = Callable[[str, str], Awaitable[tuple[int, bytes] | list[bytes]]]


async def _serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, answer: Answer) -> None:
    with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError, ssl.SSLError):
        while True:
            head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1")
            method, target, _version = head.split("\r\n", 1)[0].split(" ", 2)
            path = target.split("?", 1)[0]
            if path in FAKE_DISCOVERY:
                got: tuple[int, bytes] | list[bytes] = (200, orjson.dumps(FAKE_DISCOVERY[path]))
            else:
                got = await answer(method, target)
            if isinstance(got, list):  # a watch: chunked lines, then the end of the stream
                writer.write(
                    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
                )
                for line in got:
                    writer.write(b"%x\r\n%s\r\n" % (len(line), line))
                writer.write(b"0\r\n\r\n")
            else:
                status, body = got
                writer.write(
                    b"HTTP/1.1 %d X\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                    % (status, len(body), body)
                )
            await writer.drain()
    writer.transport.abort()


@contextlib.asynccontextmanager
async def fake_cluster(tmp_path: Path, answer: Answer) -> AsyncIterator[mcr.Cluster]:
    ca = CertificateAuthority("fake-ca")
    pair = ca.issue("fake-apiserver", server_hosts=("127.0.0.1",))
    (tmp_path / "tls.crt").write_bytes(pair.cert_pem)
    (tmp_path / "tls.key").write_bytes(pair.key_pem)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(tmp_path / "tls.crt", tmp_path / "tls.key")
    context.set_alpn_protocols(["http/1.1"])
    server = await asyncio.start_server(lambda r, w: _serve(r, w, answer), "127.0.0.1", 0, ssl=context)
    port = server.sockets[0].getsockname()[1]
    kubeconfig = {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": "fake",
        "clusters": [
            {
                "name": "fake",
                "cluster": {
                    "server": f"https://127.0.0.1:{port}",
                    "certificate-authority-data": base64.b64encode(ca.cert_pem).decode(),
                },
            }
        ],
        "users": [{"name": "fake", "user": {"token": TOKEN}}],
        "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake"}}],
    }
    try:
        async with mcr.Cluster("hostile", mcr.kubeconfig_from_dict(kubeconfig)) as cluster:
            yield cluster
    finally:
        server.close()
        await server.wait_closed()


def _configmap(name: str) -> dict[str, object]:
    return {"metadata": {"name": name, "namespace": "default", "resourceVersion": "5"}, "data": {}}


def _page(continue_token: str) -> bytes:
    meta = {"resourceVersion": "10", "continue": continue_token}
    return orjson.dumps({"kind": "ConfigMapList", "metadata": meta, "items": [_configmap("a")]})


async def test_a_continue_token_that_never_ends_is_refused_after_the_page_bound(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(answers, "MAX_PAGES", 5)
    served = 0

    async def endless(_method: str, _target: str) -> tuple[int, bytes]:
        nonlocal served
        served += 1
        return 200, _page(f"token-{served}")

    async with fake_cluster(tmp_path, endless) as cluster:
        with pytest.raises(mcr.ServerError, match="a list went on past 5 pages") as raised:
            await cluster.client.list(CONFIGMAP, namespace="default")
    assert raised.value.cluster == "hostile" and served == 5


async def test_a_continue_token_given_back_is_refused_at_once(tmp_path: Path) -> None:
    async def same(_method: str, target: str) -> tuple[int, bytes]:
        return 200, _page("again")

    async with fake_cluster(tmp_path, same) as cluster:
        with pytest.raises(mcr.ServerError, match="gave back the continue token it was asked with"):
            await cluster.client.list(CONFIGMAP, namespace="default")


@pytest.mark.parametrize(
    ("body", "said"),
    [
        (b"<html>log in</html>", "the answer to GET configmaps is not JSON, not an object"),
        (b"[1, 2]", "the answer to GET configmaps is a JSON list, not an object"),
    ],
    ids=["html", "a-list"],
)
async def test_a_2xx_that_is_not_an_object_is_a_named_error(tmp_path: Path, body: bytes, said: str) -> None:
    async def answer(_method: str, _target: str) -> tuple[int, bytes]:
        return 200, body

    async with fake_cluster(tmp_path, answer) as cluster:
        with pytest.raises(mcr.ServerError, match=said) as raised:
            await cluster.client.get(CONFIGMAP, "a", namespace="default")
    assert "cluster 'hostile'" in str(raised.value)


async def test_a_listed_item_without_a_name_is_a_named_error(tmp_path: Path) -> None:
    async def answer(_method: str, _target: str) -> tuple[int, bytes]:
        page = {"kind": "ConfigMapList", "metadata": {"resourceVersion": "1"}, "items": [{"data": {}}]}
        return 200, orjson.dumps(page)

    async with fake_cluster(tmp_path, answer) as cluster:
        with pytest.raises(mcr.ServerError, match=r"a listed item is not an object with a metadata\.name"):
            await cluster.client.list(CONFIGMAP, namespace="default")


@pytest.mark.parametrize(
    ("line", "said"),
    [
        (b"not json at all", "a watch line is not JSON"),
        (b"[1]", "a watch line is a JSON list, not an event"),
        (b'{"type": "SHOUTED", "object": {}}', "a watch event's type is 'SHOUTED'"),
        (b'{"type": "ADDED"}', "a ADDED event's object is a NoneType"),
        (b'{"type": "MODIFIED", "object": {"metadata": {"name": 5}}}', "has no metadata.name"),
    ],
    ids=["garbage", "not-an-object", "unknown-type", "no-object", "no-name"],
)
async def test_a_watch_line_that_is_not_an_event_is_a_named_error(
    tmp_path: Path, line: bytes, said: str
) -> None:
    async def answer(_method: str, _target: str) -> list[bytes]:
        return [line + b"\n"]

    async with fake_cluster(tmp_path, answer) as cluster:
        with pytest.raises(mcr.ServerError, match=said) as raised:
            async for _event in cluster.client.watch(CONFIGMAP, namespace="default"):
                pass
    assert raised.value.cluster == "hostile" and raised.value.kind == "ConfigMap"


async def test_a_refusal_that_echoes_the_token_never_shows_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)

    async def echo(_method: str, _target: str) -> tuple[int, bytes]:
        status = {
            "kind": "Status",
            "code": 403,
            "reason": "Forbidden",
            "message": f"no, {TOKEN}, you may not",
        }
        return 403, orjson.dumps(status)

    async with fake_cluster(tmp_path, echo) as cluster:
        with pytest.raises(mcr.Forbidden) as raised:
            await cluster.client.get(CONFIGMAP, "a", namespace="default")
    assert "no, [redacted], you may not" in str(raised.value)
    shown = str(raised.value) + repr(raised.value) + caplog.text
    assert TOKEN not in shown and TOKEN[:12] not in shown


async def test_a_watch_accepted_then_broken_keeps_the_informer_failing_without_flapping(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="mcruntime.informer")

    async def answer(_method: str, target: str) -> tuple[int, bytes] | list[bytes]:
        if "watch=" in target:
            return [b"garbage\n"]  # accepted, then broken, every time
        page = {"kind": "ConfigMapList", "metadata": {"resourceVersion": "10"}, "items": [_configmap("a")]}
        return 200, orjson.dumps(page)

    async with fake_cluster(tmp_path, answer) as cluster:
        informer = Informer(
            cluster.client, CONFIGMAP, namespace="default", backoff=mcr.Backoff(base=0.01, cap=0.05)
        )
        running = asyncio.create_task(informer.run())
        try:
            await wait_until(lambda: informer.stats.watch_restarts >= 8, what="eight broken watches")
            assert isinstance(informer.failing, mcr.ServerError), informer.failing
        finally:
            running.cancel()
            await asyncio.gather(running, return_exceptions=True)
    lines = [r.getMessage() for r in caplog.records if r.levelno >= logging.INFO]
    assert not [line for line in lines if "work again" in line], lines  # no flapping at each reconnect
    assert len([line for line in lines if "fails" in line]) == 1, lines  # one warning for the outage


async def test_a_watch_the_server_broke_says_what_the_server_did(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from mcruntime._client.multiplex import StreamClosed

    async def unused(_method: str, _target: str) -> tuple[int, bytes]:
        return 404, b"{}"

    async with fake_cluster(tmp_path, unused) as cluster:

        @contextlib.asynccontextmanager
        async def reset(*_args: object, **_kwargs: object) -> AsyncIterator[object]:
            # An async generator, as the transport's stream is, that fails as it opens.
            error = StreamClosed("the server reset the watch stream (INTERNAL_ERROR)")
            if error.args:
                raise error
            yield None

        monkeypatch.setattr(cluster.client.transport, "stream", reset)
        with pytest.raises(
            mcr.Unreachable, match=r"interrupted: the server reset the watch stream \(INTERNAL_ERROR\)"
        ):
            async for _event in cluster.client.watch(CONFIGMAP, namespace="default"):
                pass
        assert "INTERNAL_ERROR" in (cluster.client.transport.health.last_error or "")
