"""The ``hub`` fixture of the ClusterProfile provider's tests (``clusterprofile_hub.py``)."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest_asyncio
from clusterprofile_hub import Hub, install_crd

import mcruntime as mcr
from mcruntime.testing import Fleet, admin_config


@pytest_asyncio.fixture
async def hub(fleet: Fleet, tmp_path: Path) -> AsyncIterator[Hub]:
    plane = fleet["cluster-1"]
    async with mcr.Cluster("hub", admin_config(plane)) as writer:
        await install_crd(writer)
        namespace = f"cp-{uuid.uuid4().hex[:8]}"
        await writer.client.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
        yield Hub(plane, writer, namespace, tmp_path)
