"""Helpers shared by the webhook tests: CRDs of a test's own group, TLS peeks, running managers."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from kube_helpers import running, unique, wait_for

import mcruntime as mcr
from mcruntime.testing import ControlPlane, Fleet

CRD = mcr.Kind("apiextensions.k8s.io/v1", "CustomResourceDefinition")
SCHEMA = {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}}


def kind_crd(group: str, versions: tuple[str, ...] = ("v1",), storage: str = "v1") -> dict[str, Any]:
    """A namespaced CRD ``tests.<group>`` (kind Test) served in ``versions``."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"tests.{group}"},
        "spec": {
            "group": group,
            "scope": "Namespaced",
            "names": {"plural": "tests", "singular": "test", "kind": "Test", "listKind": "TestList"},
            "versions": [
                {"name": version, "served": True, "storage": version == storage, "schema": SCHEMA}
                for version in versions
            ],
        },
    }


def config_of(plane: ControlPlane) -> mcr.ClusterConfig:
    return mcr.kubeconfig_from_dict(plane.kubeconfig())


async def install_crd(plane: ControlPlane, crd: dict[str, Any]) -> None:
    """Create ``crd`` in ``plane`` and wait until it is established."""
    async with mcr.Cluster("setup", config_of(plane)) as cluster:
        await cluster.client.create(crd)

        async def established() -> bool:
            current = await cluster.client.get(CRD, crd["metadata"]["name"])
            conditions = (current.get("status") or {}).get("conditions") or []
            return any(c.get("type") == "Established" and c.get("status") == "True" for c in conditions)

        await wait_for(established)


def new_group() -> str:
    return f"{unique('wh')}.test.mcruntime.dev"


def webhook_options(**overrides: Any) -> mcr.WebhookOptions:
    """Options for a test: a free port, a configuration name of the test's own, removed afterwards."""
    values: dict[str, Any] = {
        "address": "127.0.0.1:0",
        "configuration_name": unique("mcruntime-test"),
        "remove_on_disengage": True,
    }
    values.update(overrides)
    return mcr.WebhookOptions(**values)


def fleet_manager(fleet: Fleet, options: mcr.WebhookOptions, **kwargs: Any) -> mcr.Manager:
    provider = mcr.StaticProvider({plane.name: config_of(plane) for plane in fleet})
    return mcr.Manager(provider, handle_signals=False, webhook=options, **kwargs)


async def registered(manager: mcr.Manager, clusters: list[str]) -> None:
    """Wait until every named cluster has the current configurations applied."""
    await wait_for(lambda: all(manager.webhook.registrar.applied.get(name, 0) >= 1 for name in clusters))


@asynccontextmanager
async def serving(manager: mcr.Manager, clusters: list[str]) -> AsyncIterator[mcr.Manager]:
    async with running(manager):
        await registered(manager, clusters)
        yield manager


def client_context(ca_pem: bytes) -> ssl.SSLContext:
    context = ssl.create_default_context(cadata=ca_pem.decode())
    return context


async def served_certificate(port: int, context: ssl.SSLContext, host: str = "127.0.0.1") -> bytes:
    """The DER certificate a fresh TLS handshake with the server presents."""
    _reader, writer = await asyncio.open_connection(host, port, ssl=context, server_hostname=host)
    try:
        ssl_object = writer.get_extra_info("ssl_object")
        certificate: bytes = ssl_object.getpeercert(binary_form=True)
        return certificate
    finally:
        writer.close()
        await writer.wait_closed()


def make_test(kind: mcr.Kind, name: str, namespace: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": kind.api_version,
        "kind": kind.kind,
        "metadata": {"name": name, "namespace": namespace},
        "spec": dict(spec),
    }
