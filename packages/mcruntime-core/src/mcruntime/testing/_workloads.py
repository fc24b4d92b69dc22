"""Controllers, a scheduler and simulated nodes for one control plane.

A plain testbed cluster stores Jobs but never runs them: nothing schedules a
Pod, nothing garbage-collects owned objects, a deleted namespace stays
Terminating. ``Workloads`` adds the upstream components that do that work,
each a process on loopback beside the cluster's kube-apiserver:

- kube-controller-manager with the controllers that workloads and deletion
  need (Jobs, CronJobs, ReplicaSets, Deployments, StatefulSets, DaemonSets,
  garbage collection, namespace deletion, Pod GC, ServiceAccounts);
- kube-scheduler, which binds Pods to nodes;
- kwok, which plays the kubelet of fake nodes through its *stages*: the
  testbed's stages (:mod:`._stages`) start every bound Pod, complete those a
  Job owns after a short run, and fail them instead when the Pod asks to.

Nothing runs a container: the cost is three processes, not a container runtime.
"""

from __future__ import annotations

import contextlib
import functools
import ssl
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from ._errors import TestbedError
from ._net import LOOPBACK, free_port, http_get, https_request
from ._process import wait_until
from ._stages import NODE_ANNOTATION, stages

if TYPE_CHECKING:
    from ._assets import WorkloadAssets
    from ._backend import Backend, Process
    from ._controlplane import ControlPlane

CONTROLLERS = (
    "job-controller",
    "cronjob-controller",
    "ttl-after-finished-controller",
    "garbage-collector-controller",
    "namespace-controller",
    "replicaset-controller",
    "deployment-controller",
    "statefulset-controller",
    "daemonset-controller",
    "pod-garbage-collector-controller",
    "serviceaccount-controller",
)
"""What kube-controller-manager runs: workloads and deletion, nothing that needs a
cloud, node IPAM or kubelets' heartbeats (the node lifecycle controller would
taint kwok's nodes once their leases went stale)."""


def _insecure_loopback_context() -> ssl.SSLContext:
    # The components serve /healthz with a certificate they generate at start;
    # the probe only asks whether our own child on loopback is up.
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context


class Workloads:
    """kube-controller-manager, kube-scheduler and kwok attached to one control plane.

    ``nodes`` fake nodes are created (``kwok-node-1`` ...) and wait until Ready.
    ``pod_run_seconds`` is how long a Job's Pod "runs" before kwok completes it.
    """

    def __init__(
        self,
        plane: ControlPlane,
        assets: WorkloadAssets,
        backend: Backend,
        *,
        nodes: int = 1,
        pod_run_seconds: float = 1.0,
    ) -> None:
        if nodes < 1:
            raise TestbedError(f"{plane.name}: a cluster with workloads needs at least one node, not {nodes}")
        self._plane = plane
        self._assets = assets
        self._backend = backend
        self.nodes = nodes
        self.pod_run_seconds = pod_run_seconds
        self.directory: Path = plane.directory / "workloads"
        self.controller_manager: Process | None = None
        self.scheduler: Process | None = None
        self.kwok: Process | None = None
        self.start_seconds: dict[str, float] = {}

    def __repr__(self) -> str:
        return f"<Workloads of {self._plane.name} nodes={self.nodes} running={self.running}>"

    @property
    def running(self) -> bool:
        return all(p is not None and p.running for p in (self.controller_manager, self.scheduler, self.kwok))

    def processes(self) -> list[Process]:
        return [p for p in (self.controller_manager, self.scheduler, self.kwok) if p is not None]

    # --- files ------------------------------------------------------------------

    def _write_files(self) -> None:
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        self._plane.kubeconfig_path()  # admin.kubeconfig, 0600, in the cluster's directory
        stages_file = self.directory / "kwok-stages.yaml"
        stages_file.write_text(yaml.safe_dump_all(stages(self.pod_run_seconds), sort_keys=False))

    @property
    def _kubeconfig(self) -> str:
        return str(self._plane.directory / "admin.kubeconfig")

    # --- argv ---------------------------------------------------------------------

    def _controller_manager_argv(self, port: int) -> list[str]:
        files = self._plane.directory
        return [
            str(self._assets.kube_controller_manager),
            f"--kubeconfig={self._kubeconfig}",
            f"--bind-address={LOOPBACK}",
            f"--secure-port={port}",
            f"--cert-dir={self.directory / 'kcm-certs'}",
            f"--controllers={','.join(CONTROLLERS)}",
            f"--service-account-private-key-file={files / 'sa.key'}",
            f"--root-ca-file={files / 'ca.crt'}",
            "--use-service-account-credentials=false",
            "--leader-elect=false",
            "--concurrent-gc-syncs=5",
            "--profiling=false",
        ]

    def _scheduler_argv(self, port: int) -> list[str]:
        return [
            str(self._assets.kube_scheduler),
            f"--kubeconfig={self._kubeconfig}",
            f"--bind-address={LOOPBACK}",
            f"--secure-port={port}",
            f"--cert-dir={self.directory / 'scheduler-certs'}",
            "--leader-elect=false",
            "--profiling=false",
        ]

    def _kwok_argv(self, port: int) -> list[str]:
        return [
            str(self._assets.kwok),
            f"--kubeconfig={self._kubeconfig}",
            f"--config={self.directory / 'kwok-stages.yaml'}",
            f"--manage-nodes-with-annotation-selector={NODE_ANNOTATION}=fake",
            f"--node-ip={LOOPBACK}",
            "--cidr=10.244.0.1/16",
            "--node-lease-duration-seconds=0",
            f"--server-address={LOOPBACK}:{port}",
        ]

    # --- lifetime ---------------------------------------------------------------

    def start(self, timeout: float) -> None:
        """Start the three components and create the nodes; returns once a node is Ready."""
        self._write_files()
        deadline = time.monotonic() + timeout
        try:
            self.controller_manager = self._start_serving(
                "kube-controller-manager", self._controller_manager_argv, deadline, https=True
            )
            self.scheduler = self._start_serving("kube-scheduler", self._scheduler_argv, deadline, https=True)
            self.kwok = self._start_serving("kwok", self._kwok_argv, deadline, https=False)
            started = time.monotonic()
            self._create_nodes()
            self._await("its nodes to become Ready", self._nodes_ready, deadline, self.kwok)
            for name in self.node_names():
                self._untaint(name)
            self.start_seconds["nodes"] = time.monotonic() - started
        except BaseException:
            self.stop()
            raise

    def _start_serving(
        self, component: str, argv: Callable[[int], list[str]], deadline: float, *, https: bool
    ) -> Process:
        """Start a component on a free loopback port, retrying if another process took it."""
        for _attempt in range(3):
            port = free_port()
            started = time.monotonic()
            process = self._backend.process(
                f"{component}[{self._plane.name}]",
                argv(port),
                self.directory / "logs" / f"{component}.log",
                mounts=(self._plane.directory,),
            )
            process.start()
            try:
                healthy = functools.partial(self._healthy, port, https)
                self._await(f"{component} to serve /healthz", healthy, deadline, process)
            except TestbedError as error:
                process.stop()
                if "address already in use" in str(error):
                    continue
                raise
            self.start_seconds[component] = time.monotonic() - started
            return process
        raise TestbedError(f"{self._plane.name}: {component} could not bind a loopback port after 3 attempts")

    @staticmethod
    def _healthy(port: int, https: bool) -> bool:
        if not https:
            plain = http_get(port, "/healthz", timeout=1.0)
            return plain is not None and plain[0] == 200
        answer = https_request(port, "GET", "/healthz", _insecure_loopback_context(), timeout=1.0)
        return answer is not None and answer[0] == 200

    def _await(self, what: str, condition: Callable[[], bool], deadline: float, process: Process) -> None:
        remaining = max(0.0, deadline - time.monotonic())
        wait_until(lambda: not process.running or condition(), remaining, interval=0.1)
        if process.running and condition():
            return
        state = "exited" if not process.running else "was not ready"
        raise TestbedError(
            f"{self._plane.name}: waiting for {what}: {process.name} {state}; "
            f"log {process.log_path}:\n{process.log_tail()}"
        )

    def _node_manifest(self, name: str) -> dict[str, Any]:
        return {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": name,
                "annotations": {NODE_ANNOTATION: "fake"},
                "labels": {
                    "kubernetes.io/hostname": name,
                    "kubernetes.io/os": "linux",
                    "kubernetes.io/arch": "amd64",
                    "type": "kwok",
                },
            },
        }

    def node_names(self) -> list[str]:
        return [f"kwok-node-{index + 1}" for index in range(self.nodes)]

    def _create_nodes(self) -> None:
        for name in self.node_names():
            self._plane._admin_call(
                self._plane.apiserver.port,
                "POST",
                "/api/v1/nodes",
                self._node_manifest(name),
                allow_conflict=True,
            )

    def _untaint(self, name: str) -> None:
        """Drop the not-ready taint the apiserver put on the new node, now that it is Ready.

        The node lifecycle controller would do that, but it also taints nodes
        whose kubelet stops heartbeating, and kwok's nodes have no kubelet.
        """
        port = self._plane.apiserver.port
        for _attempt in range(5):
            node = self._plane._admin_call(port, "GET", f"/api/v1/nodes/{name}", None)
            current = node["spec"].get("taints") or []
            taints = [t for t in current if t.get("key") != "node.kubernetes.io/not-ready"]
            if taints == current:
                return
            node["spec"]["taints"] = taints
            try:
                self._plane._admin_call(port, "PUT", f"/api/v1/nodes/{name}", node)
                return
            except TestbedError as error:
                if "-> 409" not in str(error):
                    raise
        raise TestbedError(f"{self._plane.name}: could not remove the not-ready taint of node {name}")

    def _nodes_ready(self) -> bool:
        answer = https_request(
            self._plane.apiserver.port, "GET", "/api/v1/nodes", self._plane.admin_ssl_context(), timeout=2.0
        )
        if answer is None or answer[0] != 200 or not isinstance(answer[1], dict):
            return False
        ready = set()
        for node in answer[1].get("items") or []:
            conditions = (node.get("status") or {}).get("conditions") or []
            if any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions):
                ready.add(node["metadata"]["name"])
        return set(self.node_names()) <= ready

    def stop(self) -> None:
        """Stop kwok, the scheduler and the controllers (the nodes stay, as objects)."""
        for process in (self.kwok, self.scheduler, self.controller_manager):
            if process is not None:
                with contextlib.suppress(OSError):
                    process.stop()

    def rss_bytes(self) -> int:
        """Resident memory of the three components together (0 for any that is stopped)."""
        from ._controlplane import _rss

        return sum(_rss(process) for process in self.processes())
