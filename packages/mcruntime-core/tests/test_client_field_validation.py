"""``ClusterOptions.field_validation``: a write with a field the kind lacks, refused or let through.

The API server's default stores such an object without the field and warns
(``test_client_warnings``); a controller ported from controller-runtime with
``client.WithFieldValidation(c, "Strict")`` expects the write refused instead.
"""

from __future__ import annotations

import logging

import pytest
from kube_helpers import CONFIGMAP, new_namespace, running_cluster

import mcruntime as mcr
from mcruntime.client import FieldValidation
from mcruntime.testing import Fleet

NAMESPACE = mcr.Kind("v1", "Namespace")


def _typo(name: str, namespace: str) -> dict[str, object]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": namespace},
        "dat": {"k": "v"},  # for "data"
    }


async def test_strict_refuses_every_write_that_names_an_unknown_field(fleet: Fleet) -> None:
    options = mcr.ClusterOptions(field_validation="Strict")
    async with running_cluster(fleet["cluster-1"], "strict", options) as cluster:
        namespace = await new_namespace(cluster, "strict")
        try:
            with pytest.raises(mcr.BadRequest) as refused:
                await cluster.client.create(_typo("first", namespace))
            assert 'unknown field "dat"' in str(refused.value)
            assert refused.value.cluster == "strict"
            with pytest.raises(mcr.NotFound):
                await cluster.client.get(CONFIGMAP, "first", namespace=namespace)  # nothing stored
            good = {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": "good", "namespace": namespace},
            }
            await cluster.client.create(good)  # a correct object passes
            # A patch is refused once applied: the server calls the result invalid (422).
            with pytest.raises(mcr.Invalid, match='unknown field "dat"'):
                await cluster.client.patch(CONFIGMAP, "good", {"dat": {"k": "w"}}, namespace=namespace)
            current = await cluster.client.get(CONFIGMAP, "good", namespace=namespace)
            with pytest.raises(mcr.BadRequest, match='unknown field "dat"'):
                await cluster.client.update({**current, "dat": {"k": "x"}})
        finally:
            await cluster.client.delete(NAMESPACE, namespace)


@pytest.mark.parametrize("validation", [None, "Strict"])
async def test_an_apply_with_an_unknown_field_fails_at_once_and_the_server_is_not_blamed(
    fleet: Fleet, validation: FieldValidation | None
) -> None:
    # Server-side apply refuses a field its schema lacks whatever the validation, with a 500.
    # That answer is the request's own: asked again it is the same, and the server is fine.
    options = mcr.ClusterOptions(field_validation=validation)
    async with running_cluster(fleet["cluster-1"], "applying", options) as cluster:
        namespace = await new_namespace(cluster, "applying")
        try:
            with pytest.raises(mcr.ServerError, match=r"\.dat: field not declared in schema") as refused:
                await cluster.client.apply(_typo("applied", namespace), field_manager="test")
            assert refused.value.status == 500
            assert cluster.health.last_error is None  # not counted as the server failing (nor retried)
        finally:
            await cluster.client.delete(NAMESPACE, namespace)


async def test_ignore_drops_the_field_without_a_warning(
    fleet: Fleet, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, "mcruntime.client")
    options = mcr.ClusterOptions(field_validation="Ignore")
    async with running_cluster(fleet["cluster-1"], "ignoring", options) as cluster:
        namespace = await new_namespace(cluster, "ignoring")
        try:
            created = await cluster.client.create(_typo("first", namespace))
            assert "dat" not in created
        finally:
            await cluster.client.delete(NAMESPACE, namespace)
    assert not [r for r in caplog.records if "the API server warns" in r.getMessage()]


def test_a_value_the_api_server_does_not_know_is_refused_where_it_is_given() -> None:
    with pytest.raises(
        ValueError, match="ClusterOptions: field_validation must be one of Strict, Warn, Ignore"
    ):
        mcr.ClusterOptions(field_validation="strict")  # type: ignore[arg-type]
