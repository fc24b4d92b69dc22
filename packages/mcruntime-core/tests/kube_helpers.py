"""Helpers shared by the core's tests (plain functions, imported by name)."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from kubernetes_asyncio import client, config


@asynccontextmanager
async def core_api(kubeconfig: dict[str, Any]) -> AsyncIterator[client.CoreV1Api]:
    """A CoreV1Api on its own Configuration: no global client state is touched."""
    configuration = client.Configuration()
    await config.load_kube_config_from_dict(kubeconfig, client_configuration=configuration)
    async with client.ApiClient(configuration) as api_client:
        yield client.CoreV1Api(api_client)


def unique(prefix: str) -> str:
    """A name no other test uses, so tests never share objects through names."""
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


async def make_namespace(api: client.CoreV1Api, prefix: str = "test") -> str:
    name = unique(prefix)
    await api.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    return name
