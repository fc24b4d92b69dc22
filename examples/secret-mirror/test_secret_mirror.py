"""secret-mirror, from its command line, with testbed clusters as reference and mirror."""

from __future__ import annotations

import base64
import logging
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

import mcruntime as mcr
from example_testing import admin_cluster, create_namespace, eventually, running, write_kubeconfig
from mcruntime.testing import Fleet
from secret_mirror import MIRROR_LABEL, MIRRORED_FROM, SECRET, parse_arguments, run

VALUE = "hunter2-" + uuid.uuid4().hex  # must never appear in the log


def secret(name: str, namespace: str, value: str, *, mirrored: bool = True) -> dict[str, object]:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {MIRROR_LABEL: "true"} if mirrored else {},
        },
        "type": "Opaque",
        "data": {"password": base64.b64encode(value.encode()).decode()},
    }


async def value_in(cluster: mcr.Cluster, namespace: str, name: str) -> str | None:
    try:
        found = await cluster.client.get(SECRET, name, namespace=namespace)
    except mcr.NotFound:
        return None
    return base64.b64decode(found["data"]["password"]).decode()


def holds(cluster: mcr.Cluster, namespace: str, expected: str | None) -> Callable[[], Awaitable[bool]]:
    """A condition: the Secret ``db`` holds ``expected`` (``None``: does not exist)."""

    async def check() -> bool:
        return await value_in(cluster, namespace, "db") == expected

    return check


async def test_mirrors_repairs_updates_and_deletes(
    fleet: Fleet, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    namespace = f"mirror-{uuid.uuid4().hex[:8]}"  # exists only in the reference: the mirror makes it
    reference_file = write_kubeconfig(tmp_path / "reference", fleet["cluster-1"].kubeconfig())
    mirror_file = write_kubeconfig(tmp_path / "mirror", fleet["cluster-2"].kubeconfig())
    arguments = parse_arguments(
        ["--reference", str(reference_file), "--mirror", str(mirror_file), "--namespace", namespace]
    )
    async with admin_cluster(fleet["cluster-1"]) as reference, admin_cluster(fleet["cluster-2"]) as mirror:
        await create_namespace(reference, namespace)
        await reference.client.create(secret("db", namespace, VALUE))
        await reference.client.create(secret("private", namespace, "not-for-the-mirror", mirrored=False))
        async with running(run(arguments), "secret-mirror"):
            await eventually(holds(mirror, namespace, VALUE), "db mirrored")
            copy = await mirror.client.get(SECRET, "db", namespace=namespace)
            assert MIRRORED_FROM in copy["metadata"]["labels"]

            # Changed in the mirror: put back, because the mirror is watched too.
            await mirror.client.patch(
                SECRET, "db", {"stringData": {"password": "tampered"}}, namespace=namespace
            )
            await eventually(holds(mirror, namespace, VALUE), "the tampered copy repaired")

            # Deleted in the mirror: recreated.
            await mirror.client.delete(SECRET, "db", namespace=namespace)
            await eventually(holds(mirror, namespace, VALUE), "the deleted copy recreated")

            # Changed in the reference: followed.
            await reference.client.patch(
                SECRET, "db", {"stringData": {"password": VALUE + "-rotated"}}, namespace=namespace
            )
            await eventually(holds(mirror, namespace, VALUE + "-rotated"), "rotation mirrored")

            # Deleted in the reference: the copy goes too.
            await reference.client.delete(SECRET, "db", namespace=namespace)
            await eventually(holds(mirror, namespace, None), "the copy deleted")
        assert await value_in(mirror, namespace, "private") is None
    assert "mirrored Secret" in caplog.text
    assert VALUE not in caplog.text and base64.b64encode(VALUE.encode()).decode() not in caplog.text
