"""The ClusterProfile tests' hub: a real control plane with the CRD, its profiles, and the provider reading them."""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import yaml

import mcruntime as mcr
from mcruntime.testing import ControlPlane, Target, admin_config, wait_until
from mcruntime.testing import running as run_manager
from mcruntime.testing.conformance import CLUSTER_OPTIONS, PROBE_INTERVAL
from mcruntime_clusterprofile import (
    ADDITIONAL_ARGS_EXTENSION,
    CLUSTER_MANAGER_LABEL,
    CLUSTER_PROFILE,
    AccessConfig,
    ClusterProfileProvider,
)

HERE = Path(__file__).parent
PLUGIN = HERE / "token_plugin.py"
CRD = mcr.Kind("apiextensions.k8s.io/v1", "CustomResourceDefinition")
CONFIGMAP = mcr.Kind("v1", "ConfigMap")
ACCESS_NAME = "testbed"


def access_config(*names: str, args: str = "Append", env: str = "Ignore") -> AccessConfig:
    """The consumer's provider file: the test plugin under each name, profile args appended."""
    return AccessConfig.from_dict(
        {
            "providers": [
                {
                    "name": name,
                    "execConfig": {
                        "apiVersion": "client.authentication.k8s.io/v1",
                        "command": sys.executable,
                        "args": [str(PLUGIN)],
                        "env": [{"name": "PLUGIN_TENANT", "value": "from-file"}],
                        "provideClusterInfo": True,
                    },
                    "profileSourcedCLIArgsPolicy": args,
                    "profileSourcedEnvVarsPolicy": env,
                }
                for name in (names or (ACCESS_NAME,))
            ]
        },
        origin="test provider file",
    )


async def install_crd(cluster: mcr.Cluster) -> None:
    manifest = yaml.safe_load((HERE / "clusterprofile-crd.yaml").read_text())
    with contextlib.suppress(mcr.AlreadyExists):
        await cluster.client.create(manifest)

    async def established() -> bool:
        crd = await cluster.client.get(CRD, manifest["metadata"]["name"])
        conditions = (crd.get("status") or {}).get("conditions") or []
        return any(c.get("type") == "Established" and c.get("status") == "True" for c in conditions)

    await wait_until(established, what="the ClusterProfile CRD is established")
    await wait_until(lambda: _served(cluster), what="the ClusterProfile kind is served")


async def _served(cluster: mcr.Cluster) -> bool:
    await cluster.client.discovery.refresh()
    try:
        await cluster.client.resource(CLUSTER_PROFILE)
    except mcr.KindNotFound:
        return False
    return True


class Hub:
    """A namespace of the hub, and the writes a cluster manager would make there."""

    def __init__(self, plane: ControlPlane, writer: mcr.Cluster, namespace: str, files: Path) -> None:
        self.plane, self.writer, self.namespace, self.files = plane, writer, namespace, files
        self.written: dict[str, str | None] = {}  # name -> last resourceVersion (None: deleted)

    def key(self, name: str) -> str:
        return f"{self.namespace}/{name}"

    def credential_file(self, target: Target) -> str:
        """A file holding the target's credential, named by its content (same credential, same path)."""
        if target.token is not None:
            status: dict[str, str] = {"token": target.token}
        else:
            entry = target.user_entry()
            status = {
                "clientCertificateData": base64.b64decode(entry["client-certificate-data"]).decode(),
                "clientKeyData": base64.b64decode(entry["client-key-data"]).decode(),
            }
        text = json.dumps(status)
        path = self.files / f"credential-{hashlib.sha256(text.encode()).hexdigest()[:16]}.json"
        path.write_text(text)
        path.chmod(0o600)
        return str(path)

    def access_entry(self, target: Target, name: str = ACCESS_NAME, **extra: Any) -> dict[str, Any]:
        cluster: dict[str, Any] = {
            "server": target.server,
            "certificate-authority-data": base64.b64encode(target.ca_pem).decode(),
            "extensions": [
                {
                    "name": ADDITIONAL_ARGS_EXTENSION,
                    "extension": ["--credential-file", self.credential_file(target)],
                }
            ],
        }
        cluster.update(extra)
        return {"name": name, "cluster": cluster}

    async def write(
        self,
        name: str,
        status: dict[str, Any] | None,
        *,
        labels: dict[str, str] | None = None,
        annotations: dict[str, str] | None = None,
    ) -> None:
        manifest = {
            "apiVersion": CLUSTER_PROFILE.api_version,
            "kind": "ClusterProfile",
            "metadata": {
                "name": name,
                "namespace": self.namespace,
                "labels": {CLUSTER_MANAGER_LABEL: "test-manager", **(labels or {})},
                "annotations": annotations or {},
            },
            "spec": {"displayName": name, "clusterManager": {"name": "test-manager"}},
        }
        applied = await self.writer.client.apply(manifest, field_manager="manager", force=True)
        if status is not None:
            applied = await self.writer.client.apply(
                {
                    "apiVersion": CLUSTER_PROFILE.api_version,
                    "kind": "ClusterProfile",
                    "metadata": {"name": name, "namespace": self.namespace},
                    "status": status,
                },
                field_manager="manager",
                force=True,
                subresource="status",
            )
        self.written[name] = applied["metadata"]["resourceVersion"]

    async def profile(self, name: str, target: Target, *, healthy: bool = True, **options: Any) -> None:
        await self.write(name, status_of([self.access_entry(target)], healthy=healthy), **options)

    async def delete(self, name: str) -> None:
        await self.writer.client.delete(CLUSTER_PROFILE, name, namespace=self.namespace)
        self.written[name] = None

    def provider(self, access: AccessConfig | Path | None = None, **options: Any) -> ClusterProfileProvider:
        options.setdefault("options", CLUSTER_OPTIONS)
        options.setdefault("probe_interval", PROBE_INTERVAL)
        options.setdefault("namespace", self.namespace)
        return ClusterProfileProvider(admin_config(self.plane), access or access_config(), **options)

    async def settled(self, provider: ClusterProfileProvider) -> None:
        def caught_up() -> bool:
            seen = provider.sources()
            for name, version in self.written.items():
                status = seen.get(self.key(name))
                if (version is None) != (status is None) or (status and status.version != version):
                    return False
            return True

        await wait_until(caught_up, what="the provider processed every write")


def status_of(
    access: list[dict[str, Any]], *, healthy: bool = True, field: str = "accessProviders"
) -> dict[str, Any]:
    return {
        "conditions": [
            {
                "type": "ControlPlaneHealthy",
                "status": "True" if healthy else "False",
                "reason": "Probed",
                "message": "",
                "lastTransitionTime": "2026-01-01T00:00:00Z",
            }
        ],
        field: access,
    }


async def _nothing(_request: mcr.Request) -> None:
    return None


@asynccontextmanager
async def running(provider: ClusterProfileProvider) -> AsyncIterator[mcr.Manager]:
    manager = mcr.Manager(provider, handle_signals=False)
    mcr.controller_managed_by(manager).named("noop").for_(CONFIGMAP, namespace="kube-system").complete(
        _nothing
    )
    async with run_manager(manager, tasks_must_end=False):
        yield manager
