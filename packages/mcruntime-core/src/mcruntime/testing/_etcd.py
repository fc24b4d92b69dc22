"""One etcd for a whole test session; every cluster lives under its own prefix."""

from __future__ import annotations

import base64
import contextlib
import http.client
import json
import shutil
from pathlib import Path

from ._backend import Backend, Process, ProcessBackend
from ._errors import TestbedError
from ._net import LOOPBACK, free_port, http_get
from ._process import wait_until


class Etcd:
    """An etcd member on loopback with fsync disabled (data lives for one session)."""

    def __init__(self, binary: Path, workdir: Path, backend: Backend | None = None) -> None:
        self._binary = binary
        self._workdir = workdir
        self._backend = backend or ProcessBackend()
        self.client_port: int = 0
        self._process: Process | None = None

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.client_port}"

    @property
    def process(self) -> Process | None:
        return self._process

    def _healthy(self) -> bool:
        answer = http_get(self.client_port, "/health", timeout=1.0)
        if answer is None or answer[0] != 200:
            return False
        try:
            return bool(json.loads(answer[1]).get("health") == "true")
        except ValueError:
            return False

    def _await_health(self, process: Process, timeout: float) -> bool:
        wait_until(lambda: self._healthy() or not process.running, timeout)
        return self._healthy()

    def start(self, timeout: float = 30.0) -> None:
        """Start with a fresh data directory and wait for ``/health``."""
        data_dir = self._workdir / "etcd-data"
        shutil.rmtree(data_dir, ignore_errors=True)
        for _attempt in range(3):
            self.client_port, peer_port = free_port(), free_port()
            peer = f"http://{LOOPBACK}:{peer_port}"
            self._process = self._backend.process(
                "etcd",
                [
                    str(self._binary),
                    f"--data-dir={data_dir}",
                    f"--listen-client-urls={self.url}",
                    f"--advertise-client-urls={self.url}",
                    f"--listen-peer-urls={peer}",
                    f"--initial-advertise-peer-urls={peer}",
                    f"--initial-cluster=default={peer}",
                    "--unsafe-no-fsync",
                    "--log-level=warn",
                ],
                self._workdir / "logs" / "etcd.log",
                mounts=(self._workdir,),
            )
            process = self._process
            process.start()
            if self._await_health(process, timeout):
                return
            tail = process.log_tail()
            process.stop()
            if "address already in use" not in tail:
                code = process.exit_code
                how = f"exited with code {code}" if code not in (None, -15, -9) else "did not become healthy"
                raise TestbedError(f"etcd {how} within {timeout:g}s; log {process.log_path}:\n{tail}")
        raise TestbedError(
            "etcd could not bind loopback ports after 3 attempts "
            f"(the last: {self.client_port}, {peer_port}); log {self._workdir / 'logs' / 'etcd.log'}"
        )

    def _gateway(self, path: str, body: dict[str, object]) -> dict[str, object]:
        connection = http.client.HTTPConnection(LOOPBACK, self.client_port, timeout=10)
        try:
            connection.request("POST", path, body=json.dumps(body))
            response = connection.getresponse()
            payload = response.read()
        finally:
            connection.close()
        if response.status != 200:
            raise TestbedError(f"etcd {path} -> {response.status}: {payload[:200]!r}")
        result = json.loads(payload)
        assert isinstance(result, dict)
        return result

    def revision(self) -> int:
        """The store's current revision (what resourceVersions count)."""
        reply = self._gateway("/v3/kv/range", {"key": base64.b64encode(b"/").decode(), "limit": 1})
        header = reply.get("header")
        assert isinstance(header, dict)
        return int(header["revision"])

    def compact(self) -> int:
        """Compact every revision before the current one; returns the current revision."""
        revision = self.revision()
        self._gateway("/v3/kv/compaction", {"revision": revision, "physical": True})
        return revision

    def delete_prefix(self, prefix: str) -> None:
        """Delete every key under ``prefix`` (a removed cluster's data); no-op if etcd is down."""
        key = prefix.encode()
        end = key[:-1] + bytes([key[-1] + 1])
        with contextlib.suppress(OSError, TestbedError):
            self._gateway(
                "/v3/kv/deleterange",
                {"key": base64.b64encode(key).decode(), "range_end": base64.b64encode(end).decode()},
            )

    def stop(self) -> None:
        if self._process is not None:
            self._process.stop()
