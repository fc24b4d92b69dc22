"""Exec credential plugins, run by us, bounded, and killed with their cluster.

A kubeconfig's ``exec`` user names a program that prints an ``ExecCredential``
(``client.authentication.k8s.io/v1`` or ``v1beta1``) on stdout: a bearer token
or a client certificate and key, optionally with an expiry. The runner here
starts it in its own process group with no terminal (interactive mode never
applies to a controller), gives it ``KUBERNETES_EXEC_INFO``, reads at most
``max_output`` bytes for at most ``timeout`` seconds, and kills the whole group
when it overruns or when the awaiting task is cancelled: a cluster stopping or
the manager shutting down ends every plugin it started. Errors name the
cluster and the plugin, never what the plugin printed on stdout.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import json
import os
import shutil
import signal
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .._base.errors import Unreachable
from .tokens import token_problem

DEFAULT_TIMEOUT = 60.0
"""Seconds a plugin may run before it is killed."""

DEFAULT_MAX_OUTPUT = 256 * 1024
"""Bytes of stdout a plugin may print; a credential with a certificate takes a few KiB."""

_STDERR_SHOWN = 300
_API_VERSIONS = ("client.authentication.k8s.io/v1", "client.authentication.k8s.io/v1beta1")


class ExecPluginError(Unreachable):
    """An exec credential plugin failed; names the cluster and the plugin, not the credential.

    An :class:`Unreachable`: without a credential no request can be sent, and
    callers already handle (and retry) that.
    """


@dataclass(frozen=True, repr=False)
class ExecCredential:
    """What a plugin returned. Never printed: the repr shows only what kind it is."""

    token: str | None = None
    client_certificate: bytes | None = field(default=None)
    client_key: bytes | None = field(default=None)
    expires: datetime.datetime | None = None

    def __repr__(self) -> str:
        kind = "token" if self.token else "client-certificate"
        return f"<ExecCredential {kind} expires={self.expires.isoformat() if self.expires else None}>"


_REAP_TIMEOUT = 5.0
"""Seconds to wait for a SIGKILLed plugin's exit status."""


def _resolve_command(command: str, base_dir: str | None) -> str:
    """Kubectl's rule: a relative command with a slash is relative to the kubeconfig's directory."""
    if os.sep in command and not os.path.isabs(command) and base_dir:
        return str(Path(base_dir) / command)
    return command


def _kill_group(process: asyncio.subprocess.Process) -> None:
    """SIGKILL the plugin and everything it started (it leads its own process group)."""
    if process.returncode is not None:
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError):
        process.kill()


async def _reap(process: asyncio.subprocess.Process) -> None:
    """Collect a killed plugin's exit and close its pipes ourselves, through any cancellation.

    SIGKILL makes the wait short, so a cancellation that arrives meanwhile (a second one,
    or the event loop closing) waits for it and is raised after. Cut short, the wait left
    a zombie and a transport that the garbage collector closed later, with a
    ResourceWarning, in whatever code ran then. Past ``_REAP_TIMEOUT`` the pipes are
    closed anyway: a plugin's escaped child may hold them open for as long as it likes.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + _REAP_TIMEOUT
    exited = asyncio.ensure_future(process.wait())
    interrupted = False
    try:
        while not exited.done() and (left := deadline - loop.time()) > 0:
            try:
                await asyncio.wait({exited}, timeout=left)
            except asyncio.CancelledError:
                interrupted = True
    finally:
        exited.cancel()  # nothing to cancel once it is done
        transport = getattr(process, "_transport", None)  # asyncio's Process has no public close()
        if transport is not None:
            transport.close()
    if interrupted:
        raise asyncio.CancelledError


def _parse_time(value: Any) -> datetime.datetime | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise ValueError("expirationTimestamp is not a string")
    parsed = datetime.datetime.fromisoformat(value.replace("Z", "+00:00"))
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=datetime.UTC)


_EXEC_EXTENSION = "client.authentication.k8s.io/exec"
_CLUSTER_INFO_FIELDS = (
    "tls-server-name",
    "insecure-skip-tls-verify",
    "certificate-authority-data",
    "proxy-url",
    "disable-compression",
)


def _cluster_info(server: str, entry: Mapping[str, Any]) -> dict[str, Any]:
    """``ExecCredential.spec.cluster`` as client-go fills it from the kubeconfig's cluster entry.

    The entry's inline fields are passed on, and the value of its
    ``client.authentication.k8s.io/exec`` extension becomes ``config``: how a
    kubeconfig (or a ClusterProfile) tells a shared plugin which cluster it
    is serving.
    """
    info: dict[str, Any] = {"server": server}
    for key in _CLUSTER_INFO_FIELDS:
        if entry.get(key):
            info[key] = entry[key]
    extensions = entry.get("extensions")
    if isinstance(extensions, list):
        for extension in extensions:
            if isinstance(extension, Mapping) and extension.get("name") == _EXEC_EXTENSION:
                info["config"] = extension.get("extension")
    return info


@dataclass(frozen=True)
class ExecLimits:
    """How long an exec plugin may run and how much it may print (``ClusterOptions`` sets them)."""

    timeout: float = DEFAULT_TIMEOUT
    max_output: int = DEFAULT_MAX_OUTPUT


class ExecPlugin:
    """One kubeconfig user's plugin; :meth:`run` starts it once and returns its credential."""

    def __init__(
        self,
        spec: Mapping[str, Any],
        *,
        cluster: str,
        server: str,
        base_dir: str | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        max_output: int = DEFAULT_MAX_OUTPUT,
        cluster_entry: Mapping[str, Any] | None = None,
    ) -> None:
        self.cluster = cluster
        self._cluster_entry = cluster_entry or {}
        self.api_version = str(spec.get("apiVersion", ""))
        self.command = _resolve_command(str(spec.get("command", "")), base_dir)
        # What a "not found" names: a relative path is the working directory's, as os/exec has it.
        in_path = os.sep not in self.command
        self._tried = f"{self.command} on PATH" if in_path else os.path.abspath(self.command)
        self.args = [str(arg) for arg in spec.get("args") or []]
        self.env = {str(item["name"]): str(item["value"]) for item in spec.get("env") or []}
        self.install_hint = str(spec.get("installHint") or "")
        self.provide_cluster_info = bool(spec.get("provideClusterInfo"))
        self._server = server
        self._timeout = timeout
        self._max_output = max_output
        self.runs = 0  # how many times the program was started (tests and metrics read it)

    @property
    def name(self) -> str:
        """The program's file name, as errors and statuses show it."""
        return os.path.basename(self.command)

    @property
    def timeout(self) -> float:
        """Seconds a run may take before the plugin is killed."""
        return self._timeout

    def __repr__(self) -> str:
        return f"<ExecPlugin cluster={self.cluster!r} command={os.path.basename(self.command)!r}>"

    def _error(self, message: str) -> ExecPluginError:
        return ExecPluginError(
            f"exec plugin {os.path.basename(self.command)!r}: {message}", cluster=self.cluster
        )

    def _environment(self) -> dict[str, str]:
        info: dict[str, Any] = {
            "apiVersion": self.api_version,
            "kind": "ExecCredential",
            "spec": {"interactive": False},
        }
        if self.provide_cluster_info:
            info["spec"]["cluster"] = _cluster_info(self._server, self._cluster_entry)
        environment = dict(os.environ)
        environment.update(self.env)
        environment["KUBERNETES_EXEC_INFO"] = json.dumps(info)
        return environment

    async def run(self) -> ExecCredential:
        """Run the plugin once; cancelling this kills the plugin's whole process group."""
        if self.api_version not in _API_VERSIONS:
            raise self._error(f"apiVersion {self.api_version!r} is not one of {', '.join(_API_VERSIONS)}")
        executable = self.command if os.sep in self.command else shutil.which(self.command)
        tried = self._tried
        if not executable or not os.access(executable, os.X_OK):
            hint = f"; {self.install_hint.strip()[:200]}" if self.install_hint else ""
            raise self._error(f"the program is not found or not executable (tried {tried}){hint}")
        self.runs += 1
        try:
            process = await asyncio.create_subprocess_exec(
                executable,
                *self.args,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env=self._environment(),
                start_new_session=True,  # its own process group, so we can end all of it
                close_fds=True,
            )
        except OSError as error:
            raise self._error(f"cannot start: {error.strerror}") from None
        try:
            async with asyncio.timeout(self._timeout):
                stdout, stderr = await asyncio.gather(
                    self._read(process.stdout, "stdout"), self._read(process.stderr, "stderr")
                )
                code = await process.wait()
        except TimeoutError:
            raise self._error(f"did not finish within {self._timeout:g} s and was killed") from None
        finally:
            _kill_group(process)  # also on cancellation: nothing it started outlives the call
            await _reap(process)
        if code != 0:
            shown = stderr.decode("utf-8", "replace").strip()[-_STDERR_SHOWN:]
            raise self._error(f"exited with status {code}" + (f": {shown}" if shown else ""))
        return self._credential(stdout)

    async def _read(self, stream: asyncio.StreamReader | None, name: str) -> bytes:
        assert stream is not None
        data = await stream.read(self._max_output + 1)
        chunks = [data]
        total = len(data)
        while data and total <= self._max_output:
            data = await stream.read(self._max_output + 1 - total)
            chunks.append(data)
            total += len(data)
        if total > self._max_output:
            raise self._error(f"printed more than {self._max_output} bytes on {name}")
        return b"".join(chunks)

    def _credential(self, stdout: bytes) -> ExecCredential:
        try:
            document = json.loads(stdout)
        except (ValueError, RecursionError):
            raise self._error("did not print an ExecCredential (not JSON)") from None
        if not isinstance(document, dict) or document.get("kind") != "ExecCredential":
            raise self._error("did not print an ExecCredential")
        if document.get("apiVersion") != self.api_version:
            raise self._error(
                f"printed apiVersion {str(document.get('apiVersion'))[:80]!r}, expected {self.api_version!r}"
            )
        status = document.get("status")
        if not isinstance(status, dict):
            raise self._error("the ExecCredential has no status")
        token = status.get("token")
        cert = status.get("clientCertificateData")
        key = status.get("clientKeyData")
        if token is not None and not isinstance(token, str):
            raise self._error("status.token is not a string")
        problem = token_problem(token) if token else None
        if problem:
            raise self._error(f"status.token {problem}")
        if not all(isinstance(value, str) or value is None for value in (cert, key)):
            raise self._error("status.clientCertificateData and clientKeyData must be strings")
        if bool(cert) != bool(key):
            raise self._error("status has only one of clientCertificateData and clientKeyData")
        if not token and not cert:
            raise self._error("status has neither a token nor a client certificate")
        try:
            expires = _parse_time(status.get("expirationTimestamp"))
        except ValueError:
            raise self._error("status.expirationTimestamp is not an RFC 3339 time") from None
        return ExecCredential(
            token=token or None,
            client_certificate=cert.encode() if cert else None,
            client_key=key.encode() if key else None,
            expires=expires,
        )
