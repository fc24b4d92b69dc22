"""A cluster that cannot even open its connection: unhealthy and probed, never stuck, never leaking.

Found by the provider conformance suite: a kubeconfig whose CA data is valid
base64 but no certificate made ``Cluster.start`` raise inside the ClusterSet's
engage task, so the cluster stayed "engaging" forever and was never probed;
each failed open also left a private directory behind.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import tempfile
import threading
from pathlib import Path
from typing import Any

import pytest

import mcruntime as mcr
import mcruntime.provider as mcrp
from mcruntime._client.transport import Transport
from mcruntime.testing import wait_until
from mcruntime.testing._pki import CertificateAuthority

NOT_A_CERTIFICATE = b"-----BEGIN CERTIFICATE-----\nbm90IGEgY2VydGlmaWNhdGU=\n-----END CERTIFICATE-----\n"


def config_with_ca(ca_pem: bytes) -> mcr.ClusterConfig:
    return mcr.kubeconfig_from_dict(
        {
            "clusters": [
                {
                    "name": "c",
                    "cluster": {
                        "server": "https://127.0.0.1:9",
                        "certificate-authority-data": base64.b64encode(ca_pem).decode(),
                    },
                }
            ],
            "users": [{"name": "u", "user": {"token": "t"}}],
            "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
            "current-context": "x",
        }
    )


@pytest.fixture
def private_dirs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Where transports make their private directories during the test."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    return tmp_path


async def test_a_failed_open_raises_unreachable_and_leaves_no_private_directory(private_dirs: Path) -> None:
    transport = Transport(config_with_ca(NOT_A_CERTIFICATE), "bad-ca")
    for _attempt in range(3):
        with pytest.raises(mcr.Unreachable, match="unusable TLS configuration"):
            await transport.open()
    assert list(private_dirs.iterdir()) == []
    await transport.close()


async def test_a_transport_closed_while_opening_opens_nothing(
    private_dirs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    transport = Transport(config_with_ca(CertificateAuthority("test").cert_pem), "closing")
    entered, release = threading.Event(), threading.Event()
    build = transport._ssl_context

    def slow_build() -> Any:
        entered.set()
        release.wait(10)
        return build()

    monkeypatch.setattr(transport, "_ssl_context", slow_build)
    opening = asyncio.create_task(transport.open())
    await asyncio.to_thread(entered.wait, 10)
    await transport.close()
    release.set()
    with pytest.raises(mcr.Unreachable, match="stopped"):
        await opening
    assert transport._session is None
    assert list(private_dirs.iterdir()) == []


class Engaged:
    def __init__(self) -> None:
        self.clusters: dict[str, mcr.Cluster] = {}

    async def engage(self, name: str, cluster: mcr.Cluster) -> None:
        self.clusters[name] = cluster


async def test_a_cluster_that_cannot_start_is_engaged_unhealthy_and_probed(private_dirs: Path) -> None:
    clusters = mcrp.ClusterSet(
        probe_interval=0.05, options=mcr.ClusterOptions(retry=mcr.RetryPolicy(attempts=1))
    )
    aware = Engaged()
    runner = asyncio.create_task(clusters.run(aware))
    await clusters.set("bad", config_with_ca(NOT_A_CERTIFICATE))
    cluster = await clusters.wait_engaged("bad", timeout=10)
    assert aware.clusters == {"bad": cluster}
    status = clusters.status("bad")
    assert status.phase is mcr.ClusterPhase.UNHEALTHY
    assert status.error is not None and "unusable TLS configuration" in status.error
    assert len(cluster.tasks) == 1  # its health probe, which keeps trying to open it
    runner.cancel()
    await asyncio.gather(runner, return_exceptions=True)
    assert cluster.stopped and cluster.transport.closed and len(cluster.tasks) == 0
    assert list(private_dirs.iterdir()) == []


async def test_a_cluster_removed_before_it_started_fails_nothing(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.ERROR)
    clusters = mcrp.ClusterSet()
    runner = asyncio.create_task(clusters.run(Engaged()))
    await clusters.set("brief", config_with_ca(CertificateAuthority("test").cert_pem))
    assert await clusters.remove("brief") is True
    await wait_until(lambda: len(clusters._tasks) == 0)  # its engage task ran and ended
    runner.cancel()
    await asyncio.gather(runner, return_exceptions=True)
    assert [record.getMessage() for record in caplog.records] == []
