"""Scenario S13: a validating admission webhook, mcruntime's against controller-runtime's.

Both webhooks apply one rule to ConfigMaps created in the ``admission``
namespace: the label ``bench.mcruntime.dev/tier`` must be gold, silver or
bronze. A client creates labelled (admitted) ConfigMaps through the first
plane's API server at a fixed concurrency and times every request; the same
client runs with no webhook configured, which is the baseline the *added*
latency is measured from. Each mode (none, mcruntime, go) runs once per round,
in an order drawn from the bench's seeded generator; p99 added latency of a
webhook is its p99 minus the same round's baseline p99.

The mcruntime peer (``peers/webhook_peer.py``) registers its own configuration
as mcruntime does; for the Go peer (``-webhook-port``, controller-runtime's
``webhook.Server``) the harness writes a certificate and installs the
configuration, as a Go operator's deployment manifests would. Both
configurations have the same rules, selector, ``failurePolicy: Fail`` and
timeout. Before measuring, the harness waits until the API server refuses an
unlabelled ConfigMap (dry run) with the webhook's message; after, until it
admits one again, so no run sees another's configuration.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import datetime
import ipaddress
import socket
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import orjson
from harness import PEERS, BenchError, Peer, percentile, running
from scenarios import Bench, spread
from sizes import FULL, Sizes

import mcruntime as mcr
from mcruntime.testing import ControlPlane

ADMISSION = "admission"  # namespace of the S13 objects
TIER_LABEL = "bench.mcruntime.dev/tier"
DENIAL = "must be gold, silver or bronze"
VALIDATING = mcr.Kind("admissionregistration.k8s.io/v1", "ValidatingWebhookConfiguration")
CONFIGURATIONS = {"mcruntime": "s13-mcruntime", "go": "s13-go"}


@dataclass(frozen=True)
class AdmissionSizes:
    """S13's sizes (kept here, not in ``Sizes``, so other scenarios' sizes are untouched)."""

    requests: int  # timed creates per run
    warmup: int  # untimed creates first (connections, TLS, the webhook's first calls)
    concurrency: int  # requests in flight
    rounds: int  # each mode once per round


# Seven rounds, not three: a p99 of 2,000 creates is their 20th slowest, and the baseline's
# own p99 spread over 14 ms between rounds (session 33), more than either webhook adds. The
# goal compares medians of per-round differences, and a median of seven moves less.
FULL_ADMISSION = AdmissionSizes(requests=2000, warmup=100, concurrency=8, rounds=7)
SMOKE_ADMISSION = AdmissionSizes(requests=40, warmup=5, concurrency=4, rounds=1)


def admission_sizes(sizes: Sizes) -> AdmissionSizes:
    """S13's sizes for a run of ``sizes``."""
    return FULL_ADMISSION if sizes == FULL else SMOKE_ADMISSION


# --- the client -------------------------------------------------------------------------


class Creator:
    """Creates ConfigMaps in the admission namespace over one aiohttp session (the same for every mode)."""

    def __init__(self, plane: ControlPlane) -> None:
        self.plane = plane
        self.url = f"{plane.server}/api/v1/namespaces/{ADMISSION}/configmaps"
        self.context = plane.admin_ssl_context()
        self.session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=64))

    async def close(self) -> None:
        """Close the session and its connections."""
        await self.session.close()

    async def create(self, name: str, *, tier: str | None = "gold", dry_run: bool = False) -> tuple[int, str]:
        """POST one ConfigMap; its HTTP status and, when refused, the API server's message."""
        labels = {TIER_LABEL: tier} if tier is not None else {}
        body = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": name, "labels": labels},
            "data": {"payload": "x" * 200},
        }
        params = {"dryRun": "All"} if dry_run else None
        async with self.session.post(
            self.url,
            data=orjson.dumps(body),
            params=params,
            headers={"Content-Type": "application/json"},
            ssl=self.context,
        ) as response:
            raw = await response.read()
            if response.status < 300:
                return response.status, ""
            with contextlib.suppress(ValueError):
                return response.status, str(orjson.loads(raw).get("message", ""))
            return response.status, raw.decode(errors="replace")

    async def load(self, label: str, count: int, concurrency: int) -> tuple[list[float], float]:
        """``count`` creates, ``concurrency`` at a time; per-request seconds and the wall time."""
        latencies: list[float] = []
        names = iter(range(count))

        async def worker() -> None:
            for index in names:
                began = time.perf_counter()
                status, message = await self.create(f"{label}-{index:05d}")
                latencies.append(time.perf_counter() - began)
                if status != 201:
                    raise BenchError(f"S13 {label}: create {index} answered {status}: {message}")

        began = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return latencies, time.perf_counter() - began

    async def wait_for(self, webhook: bool, timeout: float, what: str) -> None:
        """Until an unlabelled dry-run create is refused by the webhook (or admitted, ``webhook=False``)."""
        deadline = time.monotonic() + timeout
        last = ""
        while time.monotonic() < deadline:
            status, message = await self.create("probe", tier=None, dry_run=True)
            if webhook and status >= 400 and DENIAL in message:
                return
            if not webhook and status < 300:
                return
            last = f"{status} {message}"
            await asyncio.sleep(0.1)
        raise BenchError(f"S13: timed out waiting for {what}; last answer: {last}")


# --- the Go peer's certificate and configuration -----------------------------------------


def write_certificate(directory: Path) -> bytes:
    """A self-signed CA certificate for 127.0.0.1 as ``tls.crt``/``tls.key``; returns its PEM."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "s13-go-webhook")])
    now = datetime.datetime.now(datetime.UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False
        )
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(key, hashes.SHA256())
    )
    pem = certificate.public_bytes(serialization.Encoding.PEM)
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    (directory / "tls.crt").write_bytes(pem)
    key_path = directory / "tls.key"
    key_path.touch(mode=0o600)
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return pem


def go_configuration(port: int, ca: bytes) -> dict[str, Any]:
    """The Go webhook's configuration: the rules, selector and policy the mcruntime peer registers."""
    return {
        "apiVersion": VALIDATING.api_version,
        "kind": VALIDATING.kind,
        "metadata": {"name": CONFIGURATIONS["go"]},
        "webhooks": [
            {
                "name": "configmap-v1.core.validate.s13-go",
                "clientConfig": {
                    "url": f"https://127.0.0.1:{port}/validate-configmap",
                    "caBundle": base64.b64encode(ca).decode("ascii"),
                },
                "rules": [
                    {
                        "apiGroups": [""],
                        "apiVersions": ["v1"],
                        "resources": ["configmaps"],
                        "operations": ["CREATE"],
                        "scope": "*",
                    }
                ],
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ADMISSION}},
                "admissionReviewVersions": ["v1"],
                "sideEffects": "None",
                "failurePolicy": "Fail",
                "timeoutSeconds": 10,
                "matchPolicy": "Equivalent",
            }
        ],
    }


def free_port() -> int:
    """A loopback port nothing listens on now (the Go peer binds it a moment later)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


# --- the scenario -----------------------------------------------------------------------


def _figures(latencies: list[float], wall: float) -> dict[str, float]:
    return {
        "per_second": len(latencies) / wall,
        "p50_ms": percentile(latencies, 0.5) * 1000,
        "p99_ms": percentile(latencies, 0.99) * 1000,
        "mean_ms": sum(latencies) / len(latencies) * 1000,
    }


@contextlib.asynccontextmanager
async def _webhook(bench: Bench, mode: str, admin: mcr.Cluster, label: str) -> Any:
    """The mode's webhook peer, serving and configured, for the block; its configuration gone after."""
    plane = bench.planes[0]
    directory = bench.directory(label)
    if mode == "mcruntime":
        argv = [
            sys.executable,
            str(PEERS / "webhook_peer.py"),
            "--kubeconfig",
            str(plane.kubeconfig_path()),
            "--namespace",
            ADMISSION,
            "--configuration",
            CONFIGURATIONS["mcruntime"],
        ]
    else:
        assert bench.go_binary is not None
        port = free_port()
        ca = write_certificate(directory / "certs")
        argv = [str(bench.go_binary), "-webhook-port", str(port), "-cert-dir", str(directory / "certs")]
    peer = Peer(f"{mode} webhook", argv, directory.with_suffix(".log"))
    try:
        async with running(peer):
            if mode == "go":
                await admin.client.create(go_configuration(port, ca))
            yield peer
    finally:
        with contextlib.suppress(mcr.NotFound):
            await admin.client.delete(VALIDATING, CONFIGURATIONS[mode])


async def _run(bench: Bench, creator: Creator, admin: mcr.Cluster, mode: str, label: str) -> dict[str, float]:
    sizes = admission_sizes(bench.sizes)
    timeout = bench.sizes.timeout
    if mode == "none":
        await creator.wait_for(False, timeout, "no webhook in effect")
        await creator.load(f"{label}-warm", sizes.warmup, sizes.concurrency)
        return _figures(*await creator.load(label, sizes.requests, sizes.concurrency))
    async with _webhook(bench, mode, admin, label) as peer:
        try:
            await creator.wait_for(True, timeout, f"the {mode} webhook to refuse an unlabelled ConfigMap")
        except BenchError as error:
            raise BenchError(f"{error}\n{peer.log_tail()}") from None
        await creator.load(f"{label}-warm", sizes.warmup, sizes.concurrency)
        cpu_before = peer.cpu_seconds()
        latencies, wall = await creator.load(label, sizes.requests, sizes.concurrency)
        figures = _figures(latencies, wall)
        figures["cpu_ms_per_request"] = (peer.cpu_seconds() - cpu_before) * 1000 / sizes.requests
    await creator.wait_for(False, timeout, f"the {mode} webhook's configuration to be gone")
    return figures


async def s13_admission(bench: Bench) -> dict[str, Any]:
    """Admission requests/s and p99 added latency: no webhook, mcruntime's, controller-runtime's."""
    sizes = admission_sizes(bench.sizes)
    plane = bench.planes[0]
    modes = ["none", "mcruntime"] + (["go"] if bench.go_binary is not None else [])
    runs: dict[str, list[dict[str, float]]] = {mode: [] for mode in modes}
    config = mcr.kubeconfig_from_dict(plane.kubeconfig())
    async with mcr.Cluster("s13-admin", config) as admin:
        with contextlib.suppress(mcr.AlreadyExists):
            await admin.client.create(
                {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ADMISSION}}
            )
        for name in CONFIGURATIONS.values():  # a run interrupted earlier may have left one
            with contextlib.suppress(mcr.NotFound):
                await admin.client.delete(VALIDATING, name)
        creator = Creator(plane)
        try:
            for round_ in range(sizes.rounds):
                order = list(modes)
                bench.rng.shuffle(order)
                done: dict[str, dict[str, float]] = {}
                for mode in order:
                    figures = await _run(bench, creator, admin, mode, f"s13-{mode}-{round_}")
                    done[mode] = figures
                    bench.log(
                        f"S13 {mode}: {figures['per_second']:.0f} creates/s, p50 {figures['p50_ms']:.1f} ms, "
                        f"p99 {figures['p99_ms']:.1f} ms"
                    )
                baseline = done["none"]
                for mode, figures in done.items():
                    if mode != "none":
                        figures["added_p50_ms"] = figures["p50_ms"] - baseline["p50_ms"]
                        figures["added_p99_ms"] = figures["p99_ms"] - baseline["p99_ms"]
                    runs[mode].append(figures)
        finally:
            await creator.close()
    return {
        "requests": sizes.requests,
        "concurrency": sizes.concurrency,
        "rounds": sizes.rounds,
        "peers": {mode: {"runs": done, "stats": spread(done)} for mode, done in runs.items() if done},
    }
