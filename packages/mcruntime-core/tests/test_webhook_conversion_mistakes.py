"""Conversion functions that block, fail on stored data, change what they convert, or return non-JSON.

Each of these used to cost more than the one object: a blocking plain
function stalled every cluster's webhooks and was answered as a success past
the timeout; one object that fails was logged with a traceback on every one of
the API server's endless retries; a CRD missing from one cluster left the
other CRDs' conversion with a stale CA; a renamed object was left to the API
server's unnamed error; and a non-JSON value was blamed on the batch's first
objects. Called by real API servers, except where the call is one no API
server makes (a batch of hand-made objects).
"""

from __future__ import annotations

import asyncio
import base64
import logging
import ssl
import threading
import uuid
from typing import Any

import aiohttp
import pytest
from kube_helpers import unique
from webhook_helpers import (
    CRD,
    config_of,
    install_crd,
    kind_crd,
    make_test,
    new_group,
    serving,
    webhook_options,
)

import mcruntime as mcr
from mcruntime.testing import ControlPlane, Fleet, running, wait_until

LOG = "mcruntime.webhook"


def _manager(planes: list[ControlPlane], options: mcr.WebhookOptions) -> mcr.Manager:
    provider = mcr.StaticProvider({plane.name: config_of(plane) for plane in planes})
    return mcr.Manager(provider, handle_signals=False, webhook=options)


async def _multi_version_kind(*planes: ControlPlane) -> tuple[str, mcr.Kind, mcr.Kind]:
    """A CRD of a group of its own, served as v1alpha1 and v1 (stored), installed in every plane."""
    group = new_group()
    for plane in planes:
        await install_crd(plane, kind_crd(group, ("v1alpha1", "v1"), storage="v1"))
    return group, mcr.Kind(f"{group}/v1alpha1", "Test"), mcr.Kind(f"{group}/v1", "Test")


def _same(obj: dict[str, Any]) -> dict[str, Any]:
    return obj


def _messages(caplog: pytest.LogCaptureFixture, *parts: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == LOG and all(part in r.getMessage() for part in parts)]


def _review(group: str, names: list[str], *, desired: str) -> dict[str, Any]:
    """A ConversionReview as an API server sends it, of ``names`` stored as v1."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "ConversionReview",
        "request": {
            "uid": str(uuid.uuid4()),
            "desiredAPIVersion": desired,
            "objects": [
                {
                    "apiVersion": f"{group}/v1",
                    "kind": "Test",
                    "metadata": {"name": name, "namespace": "default", "uid": str(uuid.uuid4())},
                    "spec": {"image": name},
                }
                for name in names
            ],
        },
    }


async def _post(manager: mcr.Manager, cluster: str, group: str, body: dict[str, Any]) -> dict[str, Any]:
    """POST a ConversionReview to ``cluster``'s conversion URL, trusting the manager's CA."""
    bundle = manager.webhook.ca_bundle()
    assert bundle is not None
    context = ssl.create_default_context(cadata=bundle.decode())
    url = manager.webhook.conversion_url(cluster, group, "Test")
    async with (
        aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=context)) as session,
        session.post(url, json=body) as response,
    ):
        assert response.status == 200, await response.text()
        answer: dict[str, Any] = (await response.json())["response"]
        return answer


async def test_a_blocking_plain_conversion_stalls_neither_the_loop_nor_other_clusters(
    fleet: Fleet, caplog: pytest.LogCaptureFixture
) -> None:
    east, west = fleet["cluster-1"], fleet["cluster-2"]
    _group, old, new = await _multi_version_kind(east, west)
    manager = _manager([east, west], webhook_options(handler_timeout=2))
    stuck, entered, release, returned = (
        unique("stuck"),
        threading.Event(),
        threading.Event(),
        threading.Event(),
    )

    def from_hub(obj: dict[str, Any]) -> dict[str, Any]:  # plain: a synchronous lookup, say
        if obj["metadata"]["name"] == stuck:
            entered.set()
            release.wait(20)
            returned.set()
        return obj

    mcr.webhook_managed_by(manager).for_(new).with_conversion(
        hub="v1", to_hub={"v1alpha1": _same}, from_hub={"v1alpha1": from_hub}
    ).complete()
    async with (
        serving(manager, [east.name, west.name]),
        mcr.Cluster("east", config_of(east)) as in_east,
        mcr.Cluster("west", config_of(west)) as in_west,
    ):
        fine = unique("fine")
        await in_east.client.create(make_test(new, stuck, "default", image="x"))
        await in_east.client.create(make_test(new, fine, "default", image="x"))
        await in_west.client.create(make_test(new, fine, "default", image="x"))
        reader = asyncio.create_task(in_east.client.get(old, stuck, namespace="default"))
        try:
            await wait_until(lambda: bool(_messages(caplog, stuck, "took over 2")), timeout=15)
            assert _messages(caplog, stuck, "still runs in a thread")
            # The function is still blocked in its thread, and everything else is answered.
            assert (await in_west.client.get(old, fine, namespace="default"))["apiVersion"] == old.api_version
            assert (await in_east.client.get(old, fine, namespace="default"))["apiVersion"] == old.api_version
            assert entered.is_set() and not returned.is_set()
        finally:
            release.set()
            reader.cancel()
            await asyncio.gather(reader, return_exceptions=True)
        for cluster in (in_east, in_west):
            await cluster.client.delete(new, fine, namespace="default")
        await in_east.client.delete(new, stuck, namespace="default")


async def test_a_cluster_holds_at_most_its_lane_of_hung_plain_functions(
    fleet: Fleet, caplog: pytest.LogCaptureFixture
) -> None:
    east, west = fleet["cluster-1"], fleet["cluster-2"]
    group, _old, new = await _multi_version_kind(east, west)
    manager = _manager([east, west], webhook_options(handler_timeout=1, max_concurrent_per_cluster=1))
    release = threading.Event()

    def from_hub(obj: dict[str, Any]) -> dict[str, Any]:
        if obj["metadata"]["name"] == "hangs":
            release.wait(20)
        return obj

    mcr.webhook_managed_by(manager).for_(new).with_conversion(
        hub="v1", to_hub={"v1alpha1": _same}, from_hub={"v1alpha1": from_hub}
    ).complete()
    desired = f"{group}/v1alpha1"
    try:
        async with serving(manager, [east.name, west.name]):
            hung = await _post(manager, east.name, group, _review(group, ["hangs"], desired=desired))
            assert hung["result"]["status"] == "Failure"
            assert "took over 1" in hung["result"]["message"]
            # Its thread still runs: the cluster's next conversion waits for it, and says why.
            waited = await _post(manager, east.name, group, _review(group, ["next"], desired=desired))
            assert (
                "all 1 threads for this cluster's plain conversion functions are busy"
                in (waited["result"]["message"])
            )
            other = await _post(manager, west.name, group, _review(group, ["next"], desired=desired))
            assert other["result"]["status"] == "Success"
            release.set()

            async def east_again() -> bool:
                answer = await _post(manager, east.name, group, _review(group, ["after"], desired=desired))
                return bool(answer["result"]["status"] == "Success")

            await wait_until(east_again)
    finally:
        release.set()


async def test_a_converted_crd_missing_from_a_cluster_leaves_the_others_current(fleet: Fleet) -> None:
    plane = fleet["cluster-3"]
    group, _old, new = await _multi_version_kind(plane)
    manager = _manager([plane], webhook_options())
    absent = mcr.Kind(f"{new_group()}/v1", "Test")  # registered first; its CRD is nowhere
    for kind in (absent, new):
        mcr.webhook_managed_by(manager).for_(kind).with_conversion(
            hub="v1", to_hub={"v1alpha1": _same}, from_hub={"v1alpha1": _same}
        ).complete()
    async with running(manager), mcr.Cluster("check", config_of(plane)) as cluster:
        bundle = manager.webhook.ca_bundle()
        assert bundle is not None
        expected = base64.b64encode(bundle).decode()

        async def registered() -> bool:
            crd = await cluster.client.get(CRD, f"tests.{group}")
            webhook = crd["spec"]["conversion"].get("webhook") or {}
            return bool(webhook.get("clientConfig", {}).get("caBundle") == expected)

        await wait_until(registered)
        await wait_until(lambda: manager.webhook.registrar.applied.get(plane.name, 0) >= 1)
        assert plane.name not in manager.webhook.registrar.failing


async def test_one_object_that_fails_is_logged_with_its_traceback_once(
    fleet: Fleet, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger=LOG)
    plane = fleet["cluster-2"]
    _group, old, new = await _multi_version_kind(plane)
    manager = _manager([plane], webhook_options())

    async def from_hub(obj: dict[str, Any]) -> dict[str, Any]:
        raise KeyError("stored data it cannot read")

    mcr.webhook_managed_by(manager).for_(new).with_conversion(
        hub="v1", to_hub={"v1alpha1": _same}, from_hub={"v1alpha1": from_hub}
    ).complete()
    name = unique("unreadable")
    async with serving(manager, [plane.name]), mcr.Cluster("caller", config_of(plane)) as cluster:
        await cluster.client.create(make_test(new, name, "default", image="x"))
        for _ in range(3):  # as the API server's watch cache asks again, and again
            with pytest.raises(mcr.APIError, match="failed: KeyError"):
                await cluster.client.get(old, name, namespace="default")
        await cluster.client.delete(new, name, namespace="default")
    logged = _messages(caplog, name, "failed: KeyError")
    with_traceback = [r for r in logged if r.exc_info is not None]
    assert len(with_traceback) == 1 and with_traceback[0].levelno == logging.ERROR
    assert len(logged) >= 3 and all(r.levelno == logging.DEBUG for r in logged if r.exc_info is None)


async def test_a_conversion_that_renames_or_changes_the_kind_is_refused_and_named(
    fleet: Fleet, caplog: pytest.LogCaptureFixture
) -> None:
    plane = fleet["cluster-3"]
    _group, old, new = await _multi_version_kind(plane)
    manager = _manager([plane], webhook_options())

    def to_hub(obj: dict[str, Any]) -> dict[str, Any]:
        return {**obj, "kind": "Gadget"}

    async def from_hub(obj: dict[str, Any]) -> dict[str, Any]:
        metadata = dict(obj["metadata"])
        metadata["name"] += "-renamed"
        return {**obj, "metadata": metadata}

    mcr.webhook_managed_by(manager).for_(new).with_conversion(
        hub="v1", to_hub={"v1alpha1": to_hub}, from_hub={"v1alpha1": from_hub}
    ).complete()
    name = unique("renamed")
    async with serving(manager, [plane.name]), mcr.Cluster("caller", config_of(plane)) as cluster:
        await cluster.client.create(make_test(new, name, "default", image="x"))
        with pytest.raises(mcr.APIError) as renamed:
            await cluster.client.get(old, name, namespace="default")
        with pytest.raises(mcr.APIError) as rekinded:
            await cluster.client.create(make_test(old, unique("rekinded"), "default", img="x"))
        await cluster.client.delete(new, name, namespace="default")
    expected = (
        f"converting Test default/{name} from v1 to v1alpha1 changed metadata.name "
        f"from '{name}' to '{name}-renamed'"
    )
    assert expected in str(renamed.value)
    assert "from v1alpha1 to v1 changed kind from 'Test' to 'Gadget'" in str(rekinded.value)
    assert _messages(caplog, expected) and _messages(caplog, "changed kind from 'Test' to 'Gadget'")


async def test_a_non_json_value_in_a_batch_names_its_object_and_the_direction(fleet: Fleet) -> None:
    plane = fleet["cluster-1"]
    group, _old, new = await _multi_version_kind(plane)
    manager = _manager([plane], webhook_options())

    def from_hub(obj: dict[str, Any]) -> dict[str, Any]:
        if obj["metadata"]["name"] == "batch-150":
            return {**obj, "spec": {"blob": b"\x00"}}
        return obj

    mcr.webhook_managed_by(manager).for_(new).with_conversion(
        hub="v1", to_hub={"v1alpha1": _same}, from_hub={"v1alpha1": from_hub}
    ).complete()
    names = [f"batch-{index:03d}" for index in range(200)]
    async with serving(manager, [plane.name]):
        answer = await _post(manager, plane.name, group, _review(group, names, desired=f"{group}/v1alpha1"))
    message = answer["result"]["message"]
    assert f"from {group}/v1 to {group}/v1alpha1" in message, message
    assert "object 150 (default/batch-150) that cannot be encoded as JSON" in message, message
    assert "batch-000" not in message, message
