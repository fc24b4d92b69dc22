"""The webhook server over HTTP/2: the API servers' own protocol, and what a hostile client can cost.

The API servers of the other webhook tests already call over HTTP/2 (the
server offers ``h2`` first); here a client of our own (h2's, over TLS to the
real server) sends what an API server never would.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
import h2.config
import h2.connection
import h2.events
import h2.settings
import orjson
import pytest
from kube_helpers import running, wait_for
from webhook_helpers import (
    client_context,
    config_of,
    install_crd,
    kind_crd,
    make_test,
    new_group,
    serving,
    webhook_options,
)

import mcruntime as mcr
from mcruntime.testing import Fleet

KIND = mcr.Kind("example.com/v1", "Test")
JSON = [(b"content-type", b"application/json")]


def review(uid: str = "u-1") -> bytes:
    return orjson.dumps(
        {
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": uid,
                "kind": {"group": "example.com", "version": "v1", "kind": "Test"},
                "operation": "CREATE",
                "namespace": "default",
                "object": {
                    "apiVersion": "example.com/v1",
                    "kind": "Test",
                    "metadata": {"name": "t"},
                    "spec": {},
                },
                "userInfo": {"username": "alice"},
            },
        }
    )


class H2Client:
    """h2's client connection over TLS to the webhook server, events gathered per stream."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.conn = h2.connection.H2Connection(
            h2.config.H2Configuration(client_side=True, header_encoding=None)
        )
        self.events: list[h2.events.Event] = []
        self.changed = asyncio.Event()
        self.pending: dict[int, bytes] = {}
        self.ends: dict[int, bool] = {}
        self.closed = asyncio.Event()

    @classmethod
    @contextlib.asynccontextmanager
    async def connect(cls, port: int, bundle: bytes) -> AsyncIterator[H2Client]:
        context = client_context(bundle)
        context.set_alpn_protocols(["h2"])
        reader, writer = await asyncio.open_connection(
            "127.0.0.1", port, ssl=context, server_hostname="127.0.0.1"
        )
        assert writer.get_extra_info("ssl_object").selected_alpn_protocol() == "h2"
        client = cls(reader, writer)
        client.conn.initiate_connection()
        client.flush()
        pump = asyncio.create_task(client._pump())
        try:
            yield client
        finally:
            pump.cancel()
            writer.close()
            with contextlib.suppress(ssl.SSLError, ConnectionError):
                await writer.wait_closed()

    def flush(self) -> None:
        data = self.conn.data_to_send()
        if data:
            self.writer.write(data)

    async def _pump(self) -> None:
        while data := await self.reader.read(65536):
            for event in self.conn.receive_data(data):
                self.events.append(event)
                if isinstance(event, h2.events.DataReceived):
                    self.conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
            self.flush()
            self.changed.set()
        self.closed.set()
        self.changed.set()

    def send(
        self,
        path: str,
        body: bytes | None,
        headers: list[tuple[bytes, bytes]] = JSON,
        method: bytes = b"POST",
        end: bool = True,
    ) -> int:
        """Open a stream and send what the windows allow of ``body`` (all of a short one)."""
        stream_id = self.conn.get_next_available_stream_id()
        request = [
            (b":method", method),
            (b":scheme", b"https"),
            (b":authority", b"127.0.0.1"),
            (b":path", path.encode()),
        ]
        self.conn.send_headers(stream_id, request + headers, end_stream=body is None)
        self.pending[stream_id] = body or b""
        self.ends[stream_id] = end
        self.send_more(stream_id)
        return stream_id

    def send_more(self, stream_id: int) -> bool:
        """Send more of the stream's body; whether any is left."""
        body = self.pending[stream_id]
        while body and self.answer(stream_id) is None and not self.reset_codes(stream_id):
            window = self.conn.local_flow_control_window(stream_id)
            size = min(len(body), window, self.conn.max_outbound_frame_size)
            if size == 0:
                break
            last = size == len(body) and self.ends[stream_id]
            self.conn.send_data(stream_id, body[:size], end_stream=last)
            body = body[size:]
        self.pending[stream_id] = body
        self.flush()
        return bool(body) and self.answer(stream_id) is None and not self.reset_codes(stream_id)

    async def until(self, condition: Any) -> None:
        async with asyncio.timeout(30):
            while not condition():
                self.changed.clear()
                await self.changed.wait()

    def answer(self, stream_id: int) -> tuple[int, bytes] | None:
        status, body = None, b""
        for event in self.events:
            if isinstance(event, h2.events.ResponseReceived) and event.stream_id == stream_id:
                status = int(dict(event.headers)[b":status"])
            elif isinstance(event, h2.events.DataReceived) and event.stream_id == stream_id:
                body += event.data
            elif (
                isinstance(event, h2.events.StreamEnded)
                and event.stream_id == stream_id
                and status is not None
            ):
                return status, body
        return None

    async def call(self, path: str, body: bytes | None, **kwargs: Any) -> tuple[int, str]:
        stream_id = self.send(path, body, **kwargs)
        await self.until(lambda: not self.send_more(stream_id))  # the server's window updates let it go on
        await self.until(lambda: self.answer(stream_id) is not None)
        status, data = self.answer(stream_id) or (0, b"")
        return status, data.decode()

    def reset_codes(self, stream_id: int) -> list[int]:
        return [
            e.error_code
            for e in self.events
            if isinstance(e, h2.events.StreamReset) and e.stream_id == stream_id
        ]

    def goaway(self) -> h2.events.ConnectionTerminated | None:
        found = [e for e in self.events if isinstance(e, h2.events.ConnectionTerminated)]
        return found[0] if found else None


@dataclass
class Served:
    """A running manager whose webhook validates KIND, and where to call it."""

    manager: mcr.Manager
    port: int
    bundle: bytes
    path: str
    """The validating webhook's path for cluster-1."""


async def _allow(_req: mcr.AdmissionRequest) -> None:
    return None


@contextlib.asynccontextmanager
async def served(
    fleet: Fleet, validate: Callable[[mcr.AdmissionRequest], Awaitable[None]] = _allow, **options: Any
) -> AsyncIterator[Served]:
    plane = fleet["cluster-1"]
    manager = mcr.Manager(
        mcr.StaticProvider({plane.name: config_of(plane)}),
        handle_signals=False,
        webhook=webhook_options(register=False, **options),
    )
    mcr.webhook_managed_by(manager).for_(KIND).with_validator(validate).complete()
    async with running(manager):
        await wait_for(lambda: plane.name in manager.clusters())
        server = manager.webhook
        bundle, port = server.ca_bundle(), server.port
        assert bundle is not None and port is not None
        path = server.admission_url(plane.name, KIND, mutating=False).split(f":{port}", 1)[1]
        yield Served(manager, port, bundle, path)


async def test_every_refusal_and_an_answer_share_one_http2_connection_until_shutdown(fleet: Fleet) -> None:
    async with served(fleet) as it:
        path, manager = it.path, it.manager
        async with H2Client.connect(it.port, it.bundle) as client:
            status, text = await client.call(path, b"{" + b" " * (3 * 1024 * 1024) + b"}")
            assert status == 413 and "larger than 3145728 bytes" in text
            declared = [*JSON, (b"content-length", b"9999999")]
            status, text = await client.call(path, b"{", headers=declared, end=False)
            assert status == 413, "a body declared too large is refused before it comes"
            status, text = await client.call(path, b"{}", headers=[(b"content-type", b"text/plain")])
            assert status == 415 and "content type 'text/plain' is not served" in text
            status, text = await client.call(path, b"{not json")
            assert status == 400 and "the body is not JSON" in text
            status, text = await client.call(
                path.replace("/clusters/cluster-1/", "/clusters/nowhere/"), review("u-0")
            )
            # Answered as a review (per on_error): the API server shows its message to the client.
            refused = orjson.loads(text)["response"]
            assert status == 200 and refused["allowed"] is False, text
            assert "cluster 'nowhere' is not engaged with this manager" in refused["status"]["message"]
            status, text = await client.call("/healthz", None, method=b"GET")
            assert status == 404 and "no webhook is served at '/healthz'" in text
            status, text = await client.call(path, None, method=b"GET")
            assert status == 405 and "API servers call webhooks with POST" in text
            status, text = await client.call(path, review())
            assert status == 200 and orjson.loads(text)["response"] == {"uid": "u-1", "allowed": True}
            assert client.goaway() is None and not client.closed.is_set()

        # controller-runtime's webhook metrics: one series per registered webhook, not per cluster.
        def sample(name: str, **labels: str) -> float | None:
            return manager.registry.get_sample_value(f"controller_runtime_webhook_{name}", labels)

        test = "/validate/example.com/v1/Test"
        codes = (413, 415, 400, 405, 200)
        assert [sample("requests_total", webhook=test, code=str(code)) for code in codes] == [2, 1, 1, 1, 2]
        assert sample("requests_total", webhook="unmatched", code="404") == 1, "no webhook there: unmatched"
        assert sample("latency_seconds_count", webhook=test) == 7
        assert sample("requests_in_flight", webhook=test) == 0
        async with H2Client.connect(it.port, it.bundle) as client:
            status, _ = await client.call(path, review())
            assert status == 200
            stopping = asyncio.create_task(manager.webhook.close())
            await client.until(lambda: client.goaway() is not None)
            goaway = client.goaway()
            assert goaway is not None and goaway.error_code == 0
            await stopping


async def test_resetting_streams_buys_a_client_no_handlers_beyond_its_limit(fleet: Fleet) -> None:
    release = asyncio.Event()
    entered = 0

    async def validate(_req: mcr.AdmissionRequest) -> None:
        nonlocal entered
        entered += 1
        await release.wait()

    async with (
        served(fleet, validate, max_streams_per_connection=3, max_concurrent_per_cluster=8) as it,
        H2Client.connect(it.port, it.bundle) as client,
    ):
        await client.until(lambda: client.conn.remote_settings.max_concurrent_streams == 3)
        hung = [client.send(it.path, review(f"u-{n}")) for n in range(3)]
        await wait_for(lambda: entered == 3)
        for stream_id in hung:  # the rapid reset: the client forgets them, their handlers run on
            client.conn.reset_stream(stream_id, error_code=0x8)
        client.flush()
        refused = client.send(it.path, review("u-3"))
        await client.until(lambda: client.reset_codes(refused) != [])
        assert client.reset_codes(refused) == [0x7]  # REFUSED_STREAM: a client retries it
        assert entered == 3
        release.set()

        async def answered() -> bool:
            status, _ = await client.call(it.path, review("u-4"))
            return status == 200

        await wait_for(answered)
        assert all(client.answer(stream_id) is None for stream_id in hung), "no answer on a reset stream"


async def test_a_client_that_breaks_http2_loses_its_connection_with_the_fault_named(
    fleet: Fleet, caplog: pytest.LogCaptureFixture
) -> None:
    async with (
        served(fleet) as it,
        H2Client.connect(it.port, it.bundle) as good,
        H2Client.connect(it.port, it.bundle) as bad,
    ):
        assert (await good.call(it.path, review()))[0] == 200
        with caplog.at_level(logging.WARNING, logger="mcruntime.webhook"):
            # A PUSH_PROMISE: only a server may send one.
            bad.writer.write(b"\x00\x00\x04\x05\x04\x00\x00\x00\x01\x00\x00\x00\x02")
            await bad.until(lambda: bad.closed.is_set())
        goaway = bad.goaway()
        assert goaway is not None and goaway.error_code == 0x1
        assert goaway.additional_data == b"a PUSH_PROMISE from a client"
        assert "broke HTTP/2: a PUSH_PROMISE from a client" in caplog.text
        assert (await good.call(it.path, review("u-2")))[0] == 200, "the other connection is untouched"


async def test_http2_off_offers_only_http11_and_is_served(fleet: Fleet) -> None:
    async with served(fleet, http2=False) as it:
        context = client_context(it.bundle)
        context.set_alpn_protocols(["h2", "http/1.1"])
        _reader, writer = await asyncio.open_connection(
            "127.0.0.1", it.port, ssl=context, server_hostname="127.0.0.1"
        )
        assert writer.get_extra_info("ssl_object").selected_alpn_protocol() == "http/1.1"
        writer.close()
        connector = aiohttp.TCPConnector(ssl=client_context(it.bundle))
        async with (
            aiohttp.ClientSession(connector=connector) as session,
            session.post(
                f"https://127.0.0.1:{it.port}{it.path}",
                data=review(),
                headers={"Content-Type": "application/json"},
            ) as response,
        ):
            assert response.status == 200
            assert (await response.json())["response"]["allowed"] is True


async def test_api_servers_call_over_http2(fleet: Fleet) -> None:
    group = new_group()
    kind = mcr.Kind(f"{group}/v1", "Test")
    plane = fleet["cluster-1"]
    await install_crd(plane, kind_crd(group))
    manager = mcr.Manager(
        mcr.StaticProvider({plane.name: config_of(plane)}), handle_signals=False, webhook=webhook_options()
    )
    mcr.webhook_managed_by(manager).for_(kind).with_validator(_allow).complete()
    async with serving(manager, [plane.name]):
        async with mcr.Cluster("caller", config_of(plane)) as caller:
            await caller.client.create(make_test(kind, "over-h2", "default"))
        assert manager.webhook._h2_open, "the API server's calls came over HTTP/1.1"


async def test_a_callers_credentials_never_reach_the_log_even_at_debug(
    fleet: Fleet, caplog: pytest.LogCaptureFixture
) -> None:
    """An API server may authenticate to a webhook with a bearer token; hpack logs every header at DEBUG."""
    token = b"Bearer webhook-caller-secret-0123456789"
    async with served(fleet) as it, H2Client.connect(it.port, it.bundle) as client:
        with caplog.at_level(logging.DEBUG):
            status, _ = await client.call(it.path, review(), headers=[*JSON, (b"authorization", token)])
    assert status == 200
    assert "webhook-caller-secret" not in caplog.text


async def test_an_idle_connection_is_closed_and_a_clients_goaway_ends_its_own(
    fleet: Fleet, monkeypatch: pytest.MonkeyPatch
) -> None:
    from mcruntime._webhook import h2conn

    monkeypatch.setattr(h2conn, "IDLE_TIMEOUT", 0.3)  # 90 s in production
    async with served(fleet) as it:
        async with H2Client.connect(it.port, it.bundle) as idle:
            assert (await idle.call(it.path, review()))[0] == 200
            await idle.until(lambda: idle.closed.is_set())
            goaway = idle.goaway()
            assert goaway is not None and goaway.error_code == 0
        monkeypatch.setattr(h2conn, "IDLE_TIMEOUT", 90.0)
        async with H2Client.connect(it.port, it.bundle) as leaving:
            assert (await leaving.call(it.path, review()))[0] == 200
            leaving.conn.close_connection()  # the client's GOAWAY: it opens nothing more
            leaving.flush()
            await leaving.until(lambda: leaving.closed.is_set())
        await wait_for(lambda: not it.manager.webhook._h2_open)


async def test_a_client_that_gives_its_answers_no_window_is_dropped_after_the_idle_goaway(
    fleet: Fleet, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Answers waiting on a window the client never opens are held one more idle timeout, not forever."""
    from mcruntime._webhook import h2conn

    monkeypatch.setattr(h2conn, "IDLE_TIMEOUT", 0.3)
    async with served(fleet) as it:
        with caplog.at_level(logging.WARNING, logger="mcruntime.webhook"):
            async with H2Client.connect(it.port, it.bundle) as client:
                client.conn.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 0})
                streams = [client.send(it.path, review(f"u-{n}")) for n in range(3)]
                await client.until(lambda: client.closed.is_set())
                assert [client.answer(stream) for stream in streams] == [None, None, None]
                goaway = client.goaway()
                assert goaway is not None and goaway.error_code == 0  # the idle drain came first
        assert "took none of its 3 answers" in caplog.text
        await wait_for(lambda: not it.manager.webhook._h2_open)
        async with H2Client.connect(it.port, it.bundle) as again:
            assert (await again.call(it.path, review()))[0] == 200, "the server serves on"


async def test_an_idle_http1_connection_is_closed_like_an_http2_one(
    fleet: Fleet, monkeypatch: pytest.MonkeyPatch
) -> None:
    """aiohttp's own default would keep it, half a request's headers included, for an hour."""
    from mcruntime._webhook import h2conn

    monkeypatch.setattr(h2conn, "IDLE_TIMEOUT", 0.3)
    async with served(fleet) as it:
        context = client_context(it.bundle)
        context.set_alpn_protocols(["http/1.1"])
        silent = await asyncio.open_connection("127.0.0.1", it.port, ssl=context, server_hostname="127.0.0.1")
        halfway = await asyncio.open_connection(
            "127.0.0.1", it.port, ssl=context, server_hostname="127.0.0.1"
        )
        halfway[1].write(f"POST {it.path} HTTP/1.1\r\nHost: 127.0.0.1\r\n".encode())
        for reader, writer in (silent, halfway):
            async with asyncio.timeout(30):
                assert await reader.read() == b""  # closed by the server
            writer.close()


async def test_a_client_that_never_reads_is_dropped_and_costs_a_bounded_buffer(
    fleet: Fleet, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """PINGs must be answered; a client that sends them and never reads fills only one buffer."""
    from mcruntime._webhook import h2conn

    monkeypatch.setattr(h2conn, "IDLE_TIMEOUT", 0.5)
    async with served(fleet) as it:
        context = client_context(it.bundle)
        context.set_alpn_protocols(["h2"])
        _reader, writer = await asyncio.open_connection(
            "127.0.0.1", it.port, ssl=context, server_hostname="127.0.0.1"
        )
        pings = b"\x00\x00\x08\x06\x00\x00\x00\x00\x00" + b"12345678"
        writer.write(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00")
        with caplog.at_level(logging.WARNING, logger="mcruntime.webhook"):
            with pytest.raises((ConnectionError, ssl.SSLError)):  # noqa: PT012 -- the loop is how it fills
                async with asyncio.timeout(60):
                    while True:  # never reading the acknowledgements: the server stops reading, then drops us
                        writer.write(pings * 4096)
                        await writer.drain()
            await wait_for(lambda: "read nothing for" in caplog.text)
        writer.close()
        async with H2Client.connect(it.port, it.bundle) as client:
            assert (await client.call(it.path, review()))[0] == 200, "the server serves on"
