"""One Kubernetes control plane: a kube-apiserver over its own etcd prefix.

A control plane here is what a provider would call a cluster: its own CA, its own
users, its own data. Several share one etcd, separated by ``--etcd-prefix``, which
makes a cluster cost one process. A second apiserver can serve the same prefix on
another port, so a test can change a cluster's objects while its primary
apiserver is down (the outage tests of the informer need exactly that).
"""

from __future__ import annotations

import asyncio
import base64
import math
import os
import secrets
import shutil
import ssl
import sys
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from ._backend import Backend, Process, ProcessBackend
from ._errors import TestbedError
from ._etcd import Etcd
from ._net import LOOPBACK, free_port, https_request
from ._pki import CertificateAuthority, KeyPair, signing_key_pair
from ._process import wait_until
from ._workloads import Workloads

if TYPE_CHECKING:
    from ._assets import WorkloadAssets

START_TIMEOUT_VARIABLE = "MCRUNTIME_TESTBED_START_TIMEOUT"
DEFAULT_START_TIMEOUT = 60.0


def start_timeout(given: float | None = None) -> float:
    """``given``, or ``MCRUNTIME_TESTBED_START_TIMEOUT`` (default 60 s) read when a start needs it.

    Read at each start, not at import: a bad value fails the start that uses
    it, naming the variable, instead of the import of the pytest plugin (and so
    every test of the environment); and a conftest may still set it.
    """
    if given is not None:
        if not (given > 0 and math.isfinite(given)):
            raise TestbedError(f"a start timeout is a positive number of seconds, not {given!r}")
        return given
    raw = os.environ.get(START_TIMEOUT_VARIABLE, "")
    if not raw.strip():
        return DEFAULT_START_TIMEOUT
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not (value > 0 and math.isfinite(value)):
        raise TestbedError(f"{START_TIMEOUT_VARIABLE}={raw!r}: give a positive number of seconds")
    return value


ADMIN_GROUP = "system:masters"


@dataclass(frozen=True)
class User:
    """An identity the apiserver authenticates: a bearer token or a client certificate.

    Credentials are kept out of ``repr`` so a failing assertion never prints them.
    """

    name: str
    groups: tuple[str, ...] = ()
    token: str | None = field(default=None, repr=False)
    client_cert: KeyPair | None = field(default=None, repr=False)

    def kubeconfig_entry(self) -> dict[str, str]:
        if self.token is not None:
            return {"token": self.token}
        assert self.client_cert is not None
        return {
            "client-certificate-data": _b64(self.client_cert.cert_pem),
            "client-key-data": _b64(self.client_cert.key_pem),
        }


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _write_private(path: Path, data: bytes | str) -> Path:
    raw = data.encode() if isinstance(data, str) else data
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(raw)
    return path


class APIServer:
    """One kube-apiserver process serving a control plane's storage on one port."""

    def __init__(self, plane: ControlPlane, role: str, port: int) -> None:
        self._plane = plane
        self.role = role
        self.port = port
        self.process: Process | None = None

    @property
    def url(self) -> str:
        return f"https://{LOOPBACK}:{self.port}"

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.running

    def _argv(self) -> list[str]:
        plane = self._plane
        files = plane.directory
        return [
            str(plane.binary),
            f"--etcd-servers={plane.etcd.url}",
            f"--etcd-prefix={plane.etcd_prefix}",
            f"--bind-address={LOOPBACK}",
            f"--advertise-address={LOOPBACK}",
            f"--secure-port={self.port}",
            f"--tls-cert-file={files / 'apiserver.crt'}",
            f"--tls-private-key-file={files / 'apiserver.key'}",
            f"--client-ca-file={files / 'ca.crt'}",
            f"--token-auth-file={files / 'tokens.csv'}",
            f"--service-account-issuer=https://{LOOPBACK}:{plane.apiserver.port}/",
            f"--service-account-key-file={files / 'sa.pub'}",
            f"--service-account-signing-key-file={files / 'sa.key'}",
            "--service-cluster-ip-range=10.0.0.0/24",
            "--authorization-mode=RBAC",
            "--disable-admission-plugins=ServiceAccount",
            "--endpoint-reconciler-type=none",
            "--allow-privileged=true",
            "--profiling=false",
            f"--cert-dir={files / 'cert-dir'}",
            *plane.extra_args,
        ]

    def _spawn(self) -> Process:
        if self.running:
            raise TestbedError(f"{self._plane.name}: {self.role} apiserver is already running")
        self.process = self._plane.backend.process(
            f"kube-apiserver[{self._plane.name}/{self.role}]",
            self._argv(),
            self._plane.directory / "logs" / f"kube-apiserver-{self.role}.log",
            mounts=(self._plane.directory,),
            env={"GOMAXPROCS": os.environ.get("GOMAXPROCS", "2")},
        )
        self.process.start()
        return self.process

    def _ready(self) -> bool:
        context = self._plane.admin_ssl_context()
        try:
            answer = https_request(self.port, "GET", "/readyz", context, timeout=2.0)
            if answer is None or answer[0] != 200:
                return False
            answer = https_request(self.port, "GET", "/api/v1/namespaces/default", context, timeout=2.0)
        except ssl.SSLCertVerificationError as error:
            self._explain_rejected_certificate(error)
            return False  # another server holds the port: ours exits with "address already in use"
        return answer is not None and answer[0] == 200

    def _explain_rejected_certificate(self, error: ssl.SSLCertVerificationError) -> None:
        """Fail at once when this Python rejects the certificate our own apiserver serves.

        Waiting cannot fix a certificate the client's TLS verification refuses (Python
        3.13's strict X.509 checks, an OpenSSL policy): say so instead of timing out.
        """
        try:
            served = ssl.get_server_certificate((LOOPBACK, self.port), timeout=2.0)
        except OSError:
            return
        ours = (self._plane.directory / "apiserver.crt").read_text()
        if ssl.PEM_cert_to_DER_cert(served) != ssl.PEM_cert_to_DER_cert(ours):
            return
        raise TestbedError(
            f"{self._plane.name}: kube-apiserver ({self.role}, port {self.port}) serves the testbed's "
            f"certificate, but this Python ({sys.version.split()[0]}, {ssl.OPENSSL_VERSION}) "
            f"rejects it: {error.verify_message or error.reason}"
        )

    def _await_ready(self, process: Process, timeout: float) -> None:
        try:
            wait_until(lambda: not process.running or self._ready(), timeout, interval=0.1)
            if process.running and self._ready():
                return
        except TestbedError as error:
            process.stop()
            raise TestbedError(f"{error}; log {process.log_path}") from error
        tail = process.log_tail()
        code = process.exit_code
        process.stop()
        raise TestbedError(
            f"{self._plane.name}: kube-apiserver ({self.role}, port {self.port}) "
            f"{f'exited with code {code}' if code not in (None, -15, -9) else 'was not ready'} "
            f"within {timeout:g}s; log {process.log_path}:\n{tail}"
        )

    def start(self, timeout: float | None = None) -> None:
        """Start and wait until ``/readyz`` passes and namespace ``default`` reads as admin."""
        limit = start_timeout(timeout)
        self._await_ready(self._spawn(), limit)

    async def start_async(self, timeout: float | None = None) -> None:
        """Start without blocking the event loop.

        The process is spawned in the loop's thread, so the kernel still kills it
        if the test process dies; only the readiness polling runs in a thread.
        """
        limit = start_timeout(timeout)
        process = self._spawn()
        await asyncio.to_thread(self._await_ready, process, limit)

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()

    async def stop_async(self) -> None:
        await asyncio.to_thread(self.stop)

    def kill(self) -> None:
        """SIGKILL: an abrupt crash, with no graceful shutdown of open watches."""
        if self.process is not None:
            self.process.kill()

    def kubeconfig(self, user: User | None = None) -> dict[str, Any]:
        """A kubeconfig for this apiserver's address (admin unless ``user`` is given)."""
        return self._plane._kubeconfig_for(self.url, user)


class ControlPlane:
    """A cluster of the testbed: a CA, users, an etcd prefix and its apiservers.

    ``admin`` (client certificate, ``system:masters``), ``cert_user`` and
    ``token_user`` exist from the start; ``add_token_user`` and ``add_cert_user``
    make more without a restart. ``stop``/``start`` keep the data (the etcd prefix
    stays), ``remove`` deletes it.
    """

    def __init__(
        self,
        name: str,
        *,
        etcd: Etcd,
        binary: Path,
        directory: Path,
        extra_args: tuple[str, ...] = (),
        backend: Backend | None = None,
    ) -> None:
        """``extra_args`` go to every kube-apiserver of this cluster (``--watch-cache=false``, say)."""
        self.name = name
        self.backend: Backend = backend or ProcessBackend()
        self.workloads: Workloads | None = None
        self.extra_args = extra_args
        self.etcd = etcd
        self.binary = binary
        self.directory = directory
        self.etcd_prefix: str = f"/{name}-{uuid.uuid4().hex[:8]}/registry"
        self.ca: CertificateAuthority = CertificateAuthority(f"mcruntime-testbed-{name}")
        self.admin: User = self.add_cert_user("admin", groups=(ADMIN_GROUP,))
        self.cert_user: User = self.add_cert_user("cert-user", groups=(ADMIN_GROUP,))
        self.token_user: User = User("token-user", (ADMIN_GROUP,), token=secrets.token_urlsafe(32))
        self.apiserver: APIServer = APIServer(self, "primary", 0)
        self._secondaries: list[APIServer] = []
        self._ssl_context: ssl.SSLContext | None = None
        self._write_files()

    def __repr__(self) -> str:
        return f"<ControlPlane {self.name} {self.server} running={self.running}>"

    # --- files ------------------------------------------------------------------

    def _write_files(self) -> None:
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        (self.directory / "ca.crt").write_bytes(self.ca.cert_pem)
        serving = self.ca.issue("kube-apiserver", server_hosts=(LOOPBACK, "localhost"))
        (self.directory / "apiserver.crt").write_bytes(serving.cert_pem)
        _write_private(self.directory / "apiserver.key", serving.key_pem)
        assert self.admin.client_cert is not None
        (self.directory / "admin.crt").write_bytes(self.admin.client_cert.cert_pem)
        _write_private(self.directory / "admin.key", self.admin.client_cert.key_pem)
        private, public = signing_key_pair()
        _write_private(self.directory / "sa.key", private)
        (self.directory / "sa.pub").write_bytes(public)
        line = f'{self.token_user.token},{self.token_user.name},token-user-uid,"{ADMIN_GROUP}"\n'
        _write_private(self.directory / "tokens.csv", line)

    def admin_ssl_context(self) -> ssl.SSLContext:
        """An SSL context that trusts this cluster's CA and presents the admin cert."""
        if self._ssl_context is None:
            context = ssl.create_default_context(cadata=self.ca.cert_pem.decode())
            context.load_cert_chain(self.directory / "admin.crt", self.directory / "admin.key")
            self._ssl_context = context
        return self._ssl_context

    # --- lifetime ---------------------------------------------------------------

    @property
    def server(self) -> str:
        return self.apiserver.url

    @property
    def running(self) -> bool:
        return self.apiserver.running

    def start(self, timeout: float | None = None) -> None:
        """Start the primary apiserver (again, keeping its port and data), then its workloads, if any."""
        limit = start_timeout(timeout)
        self._start_apiserver(limit)
        if self.workloads is not None and not self.workloads.running:
            self.workloads.start(limit)

    def _start_apiserver(self, timeout: float) -> None:
        if self.apiserver.port:
            self.apiserver.start(timeout)
            return
        # First start: pick a port, retrying if another process took it meanwhile.
        tried: list[int] = []
        last: TestbedError | None = None
        for _attempt in range(3):
            self.apiserver.port = free_port()
            tried.append(self.apiserver.port)
            try:
                self.apiserver.start(timeout)
                return
            except TestbedError as error:
                if "address already in use" not in str(error):
                    raise
                last = error
        raise TestbedError(
            f"{self.name}: could not bind a loopback port after 3 attempts (ports {tried} were taken)"
        ) from last

    async def start_async(self, timeout: float | None = None) -> None:
        if not self.apiserver.port or self.workloads is not None:
            await asyncio.to_thread(self.start, timeout)
        else:
            await self.apiserver.start_async(timeout)

    def run_workloads(
        self,
        assets: WorkloadAssets,
        *,
        nodes: int = 1,
        pod_run_seconds: float = 1.0,
        timeout: float | None = None,
    ) -> Workloads:
        """Add kube-controller-manager, kube-scheduler and kwok nodes to this running cluster.

        From then on the cluster runs Jobs and Pods, collects garbage and
        finishes namespace deletion; ``stop``/``start`` stop and start them too.
        """
        if self.workloads is not None:
            raise TestbedError(f"{self.name}: already runs workloads")
        if not self.running:
            raise TestbedError(f"{self.name}: start the cluster before adding workloads")
        limit = start_timeout(timeout)
        workloads = Workloads(self, assets, self.backend, nodes=nodes, pod_run_seconds=pod_run_seconds)
        workloads.start(limit)
        self.workloads = workloads
        return workloads

    def stop(self) -> None:
        """Stop every process of this cluster gracefully; the data stays in etcd."""
        if self.workloads is not None:
            self.workloads.stop()
        for secondary in self._secondaries:
            secondary.stop()
        self._secondaries.clear()
        self.apiserver.stop()

    async def stop_async(self) -> None:
        await asyncio.to_thread(self.stop)

    def restart(self, timeout: float | None = None) -> None:
        self.stop()
        self.start(timeout)

    def start_secondary(self, timeout: float | None = None) -> APIServer:
        """Another apiserver over the same storage, on its own port.

        Lets a test write to the cluster while the primary is stopped; it is
        stopped with the control plane.
        """
        secondary = APIServer(self, f"secondary-{len(self._secondaries) + 1}", free_port())
        secondary.start(timeout)
        self._secondaries.append(secondary)
        return secondary

    def remove(self) -> None:
        """Stop the cluster and delete its data and files."""
        self.stop()
        self.etcd.delete_prefix(self.etcd_prefix.rstrip("/") + "/")
        shutil.rmtree(self.directory, ignore_errors=True)

    # --- users and kubeconfigs --------------------------------------------------

    def add_cert_user(self, name: str, groups: tuple[str, ...] = ()) -> User:
        """A user authenticated by a client certificate from this cluster's CA."""
        pair = self.ca.issue(name, organizations=groups, client=True)
        return User(name, groups, client_cert=pair)

    def add_token_user(self, name: str, *, cluster_admin: bool = True, namespace: str = "default") -> User:
        """A bearer-token user: a ServiceAccount with a token from the TokenRequest API.

        Works without a restart and without kube-controller-manager. Calling it
        again for the same name mints a new token (a rotation); ``revoke_token_user``
        deletes the ServiceAccount, which invalidates every token it was given.
        """
        port = self.apiserver.port
        self._admin_call(
            port,
            "POST",
            f"/api/v1/namespaces/{namespace}/serviceaccounts",
            {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name}},
            allow_conflict=True,
        )
        if cluster_admin:
            self._admin_call(
                port,
                "POST",
                "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
                {
                    "apiVersion": "rbac.authorization.k8s.io/v1",
                    "kind": "ClusterRoleBinding",
                    "metadata": {"name": f"testbed-{namespace}-{name}"},
                    "roleRef": {
                        "apiGroup": "rbac.authorization.k8s.io",
                        "kind": "ClusterRole",
                        "name": "cluster-admin",
                    },
                    "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": namespace}],
                },
                allow_conflict=True,
            )
        reply = self._admin_call(
            port,
            "POST",
            f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token",
            {
                "apiVersion": "authentication.k8s.io/v1",
                "kind": "TokenRequest",
                "spec": {"expirationSeconds": 7 * 24 * 3600},
            },
        )
        groups = ("system:serviceaccounts", f"system:serviceaccounts:{namespace}")
        return User(f"system:serviceaccount:{namespace}:{name}", groups, token=reply["status"]["token"])

    def revoke_token_user(self, name: str, namespace: str = "default") -> None:
        """Delete the ServiceAccount behind a token user, so its tokens get 401.

        The apiserver caches successful authentications for about ten seconds, so
        a test waits for the 401 rather than expecting it at once.
        """
        self._admin_call(
            self.apiserver.port,
            "DELETE",
            f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}",
            None,
        )

    def _admin_call(self, port: int, method: str, path: str, body: Any, allow_conflict: bool = False) -> Any:
        answer = https_request(port, method, path, self.admin_ssl_context(), body=body)
        if answer is None:
            raise TestbedError(f"{self.name}: {method} {path}: the apiserver did not answer")
        status, reply = answer
        if status == 409 and allow_conflict:
            return reply
        if status >= 300:
            message = reply.get("message") if isinstance(reply, dict) else reply
            raise TestbedError(f"{self.name}: {method} {path} -> {status}: {message}")
        return reply

    def _kubeconfig_for(self, server: str, user: User | None) -> dict[str, Any]:
        who = user or self.admin
        return {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": self.name,
                    "cluster": {"server": server, "certificate-authority-data": _b64(self.ca.cert_pem)},
                }
            ],
            "users": [{"name": who.name, "user": who.kubeconfig_entry()}],
            "contexts": [{"name": self.name, "context": {"cluster": self.name, "user": who.name}}],
            "current-context": self.name,
        }

    def kubeconfig(self, user: User | None = None) -> dict[str, Any]:
        """A kubeconfig dict for the primary apiserver; admin unless ``user`` is given."""
        return self._kubeconfig_for(self.server, user)

    def kubeconfig_path(self, user: User | None = None) -> Path:
        """The same kubeconfig written to a private (0600) file in the cluster's directory."""
        who = user or self.admin
        safe = "".join(char if char.isalnum() or char in "-_" else "_" for char in who.name)
        path = self.directory / f"{safe}.kubeconfig"
        return _write_private(path, yaml.safe_dump(self.kubeconfig(who), sort_keys=False))

    def processes(self) -> list[Process]:
        servers = [self.apiserver, *self._secondaries]
        found = [server.process for server in servers if server.process is not None]
        if self.workloads is not None:
            found += self.workloads.processes()
        return found

    def rss_bytes(self) -> int:
        """Resident memory of the primary apiserver (0 when stopped)."""
        return _rss(self.apiserver.process)


def _rss(process: Process | None) -> int:
    if process is None or process.pid is None or not process.running:
        return 0
    try:
        status = Path(f"/proc/{process.pid}/status").read_text()
    except FileNotFoundError:
        return 0
    for line in status.splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0
