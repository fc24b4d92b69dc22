"""The webhook server's edges: bad input, readiness, and certificates rotating under load."""

from __future__ import annotations

import asyncio
import io
import json
import logging
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from kube_helpers import running, sockets_on, unique, wait_for
from webhook_helpers import (
    client_context,
    config_of,
    fleet_manager,
    install_crd,
    kind_crd,
    make_test,
    new_group,
    served_certificate,
    serving,
    webhook_options,
)

import mcruntime as mcr
from mcruntime.testing import Fleet
from mcruntime.testing._pki import CertificateAuthority
from mcruntime.webhook import WebhookServer

KIND = mcr.Kind("example.com/v1", "Test")
JSON = {"Content-Type": "application/json"}


def review(api_version: str = "admission.k8s.io/v1") -> dict[str, Any]:
    return {
        "apiVersion": api_version,
        "kind": "AdmissionReview",
        "request": {
            "uid": "u-1",
            "kind": {"group": "example.com", "version": "v1", "kind": "Test"},
            "operation": "CREATE",
            "namespace": "default",
            "object": {"apiVersion": "example.com/v1", "kind": "Test", "metadata": {"name": "t"}, "spec": {}},
            "userInfo": {"username": "alice"},
        },
    }


async def test_bad_input_gets_a_clear_4xx_and_the_server_keeps_serving(fleet: Fleet) -> None:
    plane = fleet["cluster-1"]
    manager = mcr.Manager(
        mcr.StaticProvider({plane.name: config_of(plane)}),
        handle_signals=False,
        webhook=webhook_options(register=False),
        health_probe_address="127.0.0.1:0",
    )

    async def default(req: mcr.AdmissionRequest) -> None:
        assert req.object is not None
        req.object["spec"]["replicas"] = 1

    mcr.webhook_managed_by(manager).for_(KIND).with_defaulter(default).complete()
    async with running(manager):
        await wait_for(lambda: plane.name in manager.clusters())
        server = manager.webhook
        bundle = server.ca_bundle()
        assert bundle is not None
        url = server.admission_url(plane.name, KIND, mutating=True)
        connector = aiohttp.TCPConnector(ssl=client_context(bundle))
        async with aiohttp.ClientSession(connector=connector) as session:

            async def post(
                target: str, body: bytes, content_type: str = "application/json"
            ) -> tuple[int, str]:
                data = io.BytesIO(body)
                async with session.post(
                    target, data=data, headers={"Content-Type": content_type}
                ) as response:
                    return response.status, await response.text()

            status, text = await post(url, b"{" + b" " * (3 * 1024 * 1024) + b"}")
            assert status == 413 and "larger than 3145728 bytes" in text
            status, text = await post(url, b"{}", "text/plain")
            assert status == 415 and "content type 'text/plain' is not served" in text
            status, text = await post(url, b"{not json")
            assert status == 400 and "the body is not JSON" in text
            elsewhere = url.replace(f"/clusters/{plane.name}/", "/clusters/nowhere/")
            status, text = await post(elsewhere, json.dumps(review()).encode())
            refused = json.loads(text)["response"]  # per on_error, so the API server shows why
            assert status == 200 and refused["allowed"] is False, text
            assert "cluster 'nowhere' is not engaged with this manager" in refused["status"]["message"]
            status, text = await post(url.replace("/Test", "/Other"), b"{}")
            assert status == 404 and "no mutating webhook is registered for Other.example.com/v1" in text
            import orjson

            status, text = await post(url, orjson.dumps(review("admission.k8s.io/v1beta1")))
            assert status == 400 and "'admission.k8s.io/v1beta1' is not served" in text
            deep: dict[str, Any] = review()
            nested: dict[str, Any] = deep["request"]["object"]["spec"]
            for _ in range(300):  # orjson reads 1,024 levels and writes 254: no copy for the defaulter
                nested["a"] = {}
                nested = nested["a"]
            status, text = await post(url, json.dumps(deep).encode())  # orjson would not write it
            answer = orjson.loads(text)
            assert status == 200 and answer["response"]["allowed"] is False, text
            assert "the object cannot be copied for the defaulter" in answer["response"]["status"]["message"]
            # Still serving: a good review is answered, with the defaulter's patch.
            status, text = await post(url, orjson.dumps(review()))
            answer = orjson.loads(text)
            assert status == 200 and answer["response"]["allowed"] is True
            assert answer["response"]["patchType"] == "JSONPatch"

        async with (
            aiohttp.ClientSession() as plain,
            plain.get(manager.endpoints.url("/readyz") + "?verbose") as response,
        ):
            text = await response.text()
        assert "[+]webhook ok" in text
        assert "[+]webhook:certificate (expires " in text


async def test_an_http1_client_gone_mid_body_costs_no_error_in_the_log(
    fleet: Fleet, caplog: pytest.LogCaptureFixture
) -> None:
    """As a reset HTTP/2 stream: the call is dropped quietly, and the server serves on."""
    plane = fleet["cluster-1"]
    manager = mcr.Manager(
        mcr.StaticProvider({plane.name: config_of(plane)}),
        handle_signals=False,
        webhook=webhook_options(register=False),
    )
    calls: list[str] = []

    async def validate(req: mcr.AdmissionRequest) -> None:
        calls.append(req.uid)

    mcr.webhook_managed_by(manager).for_(KIND).with_validator(validate).complete()
    async with running(manager):
        await wait_for(lambda: plane.name in manager.clusters())
        server = manager.webhook
        bundle = server.ca_bundle()
        assert bundle is not None and server.port is not None
        url = server.admission_url(plane.name, KIND, mutating=False)
        path = url.partition(f":{server.port}")[2]
        context = client_context(bundle)
        context.set_alpn_protocols(["http/1.1"])
        with caplog.at_level(logging.INFO):
            _reader, writer = await asyncio.open_connection(
                "127.0.0.1", server.port, ssl=context, server_hostname="127.0.0.1"
            )
            head = f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n"
            writer.write(head.encode() + b'{"apiVersion":')
            await writer.drain()
            writer.transport.abort()  # gone mid-body

            def lost() -> float | None:
                labels = {"webhook": "/validate/example.com/v1/Test", "code": "400"}
                return manager.metrics.registry.get_sample_value(
                    "controller_runtime_webhook_requests_total", labels
                )

            await wait_for(lambda: lost() == 1.0)  # answered 400 "gave up", to nobody
            connector = aiohttp.TCPConnector(ssl=client_context(bundle))
            async with (
                aiohttp.ClientSession(connector=connector) as session,
                session.post(url, data=json.dumps(review()).encode(), headers=JSON) as response,
            ):
                assert response.status == 200, await response.text()
        assert calls == ["u-1"]
        assert not [record for record in caplog.records if record.levelno >= logging.ERROR]


async def test_certificates_rotate_while_api_servers_call_and_no_request_fails(fleet: Fleet) -> None:
    group, namespace = new_group(), "default"
    kind = mcr.Kind(f"{group}/v1", "Test")
    for plane in fleet:
        await install_crd(plane, kind_crd(group))
    manager = fleet_manager(fleet, webhook_options())
    names = [plane.name for plane in fleet]
    served = 0
    progress = asyncio.Condition()

    async def validate(req: mcr.AdmissionRequest) -> None:
        nonlocal served
        async with progress:
            served += 1
            progress.notify_all()

    mcr.webhook_managed_by(manager).for_(kind).with_validator(validate).complete()
    rotations = 4
    async with serving(manager, names):
        server = manager.webhook
        bundle = server.ca_bundle()
        assert bundle is not None and server.port is not None
        stop = asyncio.Event()
        failures: list[BaseException] = []
        created = 0

        async def keep_creating(name: str) -> None:
            nonlocal created
            async with mcr.Cluster("caller", config_of(fleet[name])) as cluster:
                while not stop.is_set():
                    try:
                        await cluster.client.create(make_test(kind, unique("r"), namespace, image="x"))
                        created += 1
                    except Exception as error:
                        failures.append(error)
                        return

        creators = [asyncio.create_task(keep_creating(name)) for name in names for _ in range(2)]
        certificates = {await served_certificate(server.port, client_context(bundle))}
        try:
            for _ in range(rotations):
                async with progress:
                    target = served + 6
                    await progress.wait_for(lambda: served >= target or bool(failures))  # noqa: B023
                await server.rotate_certificate()
                certificates.add(await served_certificate(server.port, client_context(bundle)))
            async with progress:
                target = served + 6
                await progress.wait_for(lambda: served >= target or bool(failures))
        finally:
            stop.set()
            await asyncio.gather(*creators)
        assert failures == []
        assert len(certificates) == rotations + 1
        assert created >= 6 * (rotations + 1)


def write_pair(directory: Path, authority: CertificateAuthority) -> bytes:
    pair = authority.issue("webhook", server_hosts=("127.0.0.1", "localhost"))
    (directory / "tls.key").write_bytes(pair.key_pem)
    (directory / "tls.crt").write_bytes(pair.cert_pem)
    return pair.cert_pem


def der(pem: bytes) -> bytes:
    import ssl

    return ssl.PEM_cert_to_DER_cert(pem.decode())


async def test_certificate_files_rotated_on_disk_are_picked_up(fleet: Fleet, tmp_path: Path) -> None:
    plane = fleet["cluster-2"]
    authority = CertificateAuthority("user CA")
    first = write_pair(tmp_path, authority)
    manager = mcr.Manager(
        mcr.StaticProvider({plane.name: config_of(plane)}),
        handle_signals=False,
        webhook=webhook_options(cert_dir=tmp_path, reload_interval=0.05),
    )
    mcr.webhook_managed_by(manager).for_(KIND).with_validator(lambda _req: asyncio.sleep(0)).complete()
    async with running(manager):
        server = manager.webhook
        assert server.port is not None and server.ca_bundle() is None and not server.options.registers
        context = client_context(authority.cert_pem)
        assert await served_certificate(server.port, context) == der(first)
        second = write_pair(tmp_path, authority)

        async def serves_second() -> bool:
            assert server.port is not None
            return await served_certificate(server.port, context) == der(second)

        await wait_for(serves_second)
        # A half-written rotation (a certificate whose key is not there yet) keeps the last good pair.
        (tmp_path / "tls.crt").write_bytes(authority.issue("other", server_hosts=("127.0.0.1",)).cert_pem)
        assert await server.certificates.refresh() is False
        assert await served_certificate(server.port, context) == der(second)


def expired_pair(directory: Path) -> bytes:
    """A self-signed certificate that expired a day ago, and its key, written as the cert dir's pair."""
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "expired webhook")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=30))
        .not_valid_after(now - datetime.timedelta(days=1))
        .sign(key, hashes.SHA256())
    )
    cert_pem = cert.public_bytes(serialization.Encoding.PEM)
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    (directory / "tls.key").write_bytes(key_pem)
    (directory / "tls.crt").write_bytes(cert_pem)
    return cert_pem


async def test_certificate_files_rotated_to_an_expired_pair_keep_the_good_one(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Found by a review: a pair that loads but has expired replaced the valid one, logged at
    # INFO, and every new connection from every API server then failed its handshake.
    from mcruntime._webhook.certs import CertificateFiles

    authority = CertificateAuthority("user CA")
    write_pair(tmp_path, authority)
    files = CertificateFiles(tmp_path / "tls.crt", tmp_path / "tls.key")
    await files.load()
    good = files.not_after()
    assert good is not None
    expired_pair(tmp_path)
    with caplog.at_level(logging.INFO, logger="mcruntime.webhook"):
        assert await files.refresh() is False
        assert await files.refresh() is False  # said once, not at every look
    assert files.not_after() == good
    said = [r for r in caplog.records if r.name == "mcruntime.webhook"]
    assert [r.levelno for r in said] == [logging.WARNING], [r.getMessage() for r in said]
    assert (
        "changed to one that expired at" in said[0].getMessage()
        and "serving the loaded one" in said[0].getMessage()
    )
    write_pair(tmp_path, authority)  # renewed: loaded again
    assert await files.refresh() is True


async def test_an_expired_pair_at_start_is_loaded_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from mcruntime._webhook.certs import CertificateFiles

    expired_pair(tmp_path)
    files = CertificateFiles(tmp_path / "tls.crt", tmp_path / "tls.key")
    with caplog.at_level(logging.WARNING, logger="mcruntime.webhook"):
        await files.load()  # nothing better to serve: /readyz names the expiry
    assert any("expired at" in r.getMessage() for r in caplog.records if r.name == "mcruntime.webhook")


async def test_a_call_that_waits_out_its_time_for_the_clusters_lane_says_so(fleet: Fleet) -> None:
    # Found by a review: a call timed out waiting for its cluster's lane was answered "the
    # validator did not answer within 9.0s" (and logged as a slow validator) although the
    # validator never ran: a flood from one cluster read as a slow handler.
    plane = fleet["cluster-1"]
    manager = mcr.Manager(
        mcr.StaticProvider({plane.name: config_of(plane)}),
        handle_signals=False,
        webhook=webhook_options(register=False, max_concurrent_per_cluster=1),
    )
    entered, release = asyncio.Event(), asyncio.Event()

    async def holds(req: mcr.AdmissionRequest) -> None:
        if req.name == "holder":
            entered.set()
            await release.wait()

    mcr.webhook_managed_by(manager).for_(KIND).with_validator(holds).complete()
    async with running(manager):
        await wait_for(lambda: plane.name in manager.clusters())
        server = manager.webhook
        bundle = server.ca_bundle()
        assert bundle is not None
        url = server.admission_url(plane.name, KIND, mutating=False)
        connector = aiohttp.TCPConnector(ssl=client_context(bundle))
        async with aiohttp.ClientSession(connector=connector) as session:

            async def post(name: str, timeout: str) -> dict[str, Any]:
                body = review()
                body["request"]["object"]["metadata"]["name"] = name
                body["request"]["name"] = name
                async with session.post(f"{url}?timeout={timeout}", json=body) as response:
                    answer: dict[str, Any] = await response.json()
                    return answer

            holder = asyncio.create_task(post("holder", "30s"))
            await asyncio.wait_for(entered.wait(), timeout=20)
            waited = await post("waiter", "1s")  # nine tenths of it: 0.9 s, all in the lane's queue
            release.set()
            held = await holder
    message = waited["response"]["status"]["message"]
    assert waited["response"]["allowed"] is False
    assert (
        f"the validator never ran: the lane of cluster '{plane.name}' was full (1 calls at once)" in message
    ), message
    assert held["response"]["allowed"] is True


def test_a_timed_out_call_names_the_lane_when_the_wait_took_its_time() -> None:
    from mcruntime._webhook.calling import lane_timeout

    assert (
        lane_timeout("validator", "east", 16, 9.0, 0.0, 0.001) == "the validator did not answer within 9.0s"
    )
    assert lane_timeout("defaulter", "east", 16, 9.0, 0.0, 6.5) == (
        "the defaulter did not answer within 9.0s, 6.5s of them spent waiting for the lane of cluster 'east' "
        "(16 calls at once)"
    )
    assert lane_timeout("validator", "", 4, 2.0, 0.0, None).startswith(
        "the validator never ran: the lane of cluster '(local)' was full (4 calls at once)"
    )


async def test_a_self_made_certificate_is_renewed_before_it_expires() -> None:
    import contextlib
    import datetime

    server = WebhookServer(
        mcr.WebhookOptions(
            address="127.0.0.1:0", certificate_validity=datetime.timedelta(seconds=6), reload_interval=0.05
        ),
        clusters=dict,
    )
    await server.listen()
    loop = asyncio.create_task(server.run())
    try:
        bundle = server.ca_bundle()
        assert bundle is not None and server.port is not None
        first = await served_certificate(server.port, client_context(bundle))
        expires = server.certificates.not_after()

        async def renewed() -> bool:
            assert server.port is not None
            return await served_certificate(server.port, client_context(bundle)) != first

        await wait_for(renewed, timeout=20)
        renewed_expiry = server.certificates.not_after()
        assert expires is not None and renewed_expiry is not None and renewed_expiry > expires
    finally:
        loop.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await loop
        await server.close()


async def test_closing_drops_a_connection_whose_peer_never_answers_the_tls_goodbye() -> None:
    """An API server that keeps a connection open and silent must not keep its socket past close()."""
    import socket
    import threading

    server = WebhookServer(mcr.WebhookOptions(address="127.0.0.1:0"), clusters=dict)
    await server.listen()
    bundle = server.ca_bundle()
    port = server.port
    assert bundle is not None and port is not None
    done = threading.Event()
    connected = threading.Event()

    def silent_peer() -> None:
        context = client_context(bundle)
        with (
            socket.create_connection(("127.0.0.1", port)) as raw,
            context.wrap_socket(raw, server_hostname="127.0.0.1"),
        ):
            connected.set()
            done.wait()  # never reads: the server's close_notify goes unanswered

    peer = threading.Thread(target=silent_peer, daemon=True)
    peer.start()
    try:
        await asyncio.to_thread(connected.wait)
        await wait_for(lambda: sockets_on(port) == 2)  # the listener and the peer's
        await server.close()
        assert sockets_on(port) == 0
    finally:
        done.set()
        await asyncio.to_thread(peer.join)
