"""A registration another writer deletes or edits is put back, and the log names what had changed.

Before, the registrar applied a cluster's configurations once and then only on
a change of its own (a handler added, the CA rotated): a configuration deleted
by a cleanup script left that cluster's objects unchecked, with /readyz green
and not one line in the log.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest
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
from mcruntime._webhook.registration import _holds
from mcruntime.testing import ControlPlane, Fleet, wait_until

VALIDATING = mcr.Kind("admissionregistration.k8s.io/v1", "ValidatingWebhookConfiguration")


def _checking_manager(plane: ControlPlane) -> mcr.Manager:
    """A manager of ``plane`` alone whose registration is checked twice a second."""
    provider = mcr.StaticProvider({plane.name: config_of(plane)})
    return mcr.Manager(provider, handle_signals=False, webhook=webhook_options(verify_interval=0.5))


async def test_a_configuration_deleted_or_edited_by_another_writer_is_restored_and_named(
    fleet: Fleet, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="mcruntime.webhook")
    plane = fleet["cluster-1"]
    group = new_group()
    kind = mcr.Kind(f"{group}/v1", "Test")
    await install_crd(plane, kind_crd(group))
    manager = _checking_manager(plane)
    name = manager.webhook.options.configuration_name

    async def deny(req: mcr.AdmissionRequest) -> None:
        raise mcr.Denied(f"checked in {req.cluster}")

    mcr.webhook_managed_by(manager).for_(kind).with_validator(deny).complete()
    async with serving(manager, [plane.name]), mcr.Cluster("other-writer", config_of(plane)) as other:
        registrar = manager.webhook.registrar
        applies = registrar.applied[plane.name]
        await wait_until(
            lambda: registrar.checked.get(plane.name, 0) >= 1, what="a periodic check that found nothing"
        )
        # A check of an untouched registration reads it back and writes nothing.
        assert registrar.restored.get(plane.name, 0) == 0 and registrar.applied[plane.name] == applies

        await other.client.delete(VALIDATING, name)
        await wait_until(lambda: registrar.restored.get(plane.name, 0) == 1, what="the deletion restored")
        attempts = iter(range(1_000_000))

        async def refused() -> bool:
            # The API server reads webhook configurations through a watch of its own: until it
            # has seen the restored one, a write may still pass unchecked. Try until it is called.
            try:
                await other.client.create(make_test(kind, f"after-{next(attempts)}", "default", image="x"))
            except mcr.Forbidden as error:
                denials.append(str(error))
                return True
            return False

        denials: list[str] = []

        await wait_until(refused, what="the restored webhook called")
        assert f"checked in {plane.name}" in denials[0], denials

        edited = await other.client.get(VALIDATING, name)
        ours = edited["webhooks"][0]["clientConfig"]["url"]
        edited["webhooks"][0]["clientConfig"]["url"] = "https://127.0.0.1:1/elsewhere"
        await other.client.patch(VALIDATING, name, {"webhooks": edited["webhooks"]})
        await wait_until(lambda: registrar.restored.get(plane.name, 0) == 2, what="the edit restored")
        restored = await other.client.get(VALIDATING, name)
        assert restored["webhooks"][0]["clientConfig"]["url"] == ours
    warnings = [
        r.getMessage()
        for r in caplog.records
        if r.levelno == logging.WARNING and r.name == "mcruntime.webhook"
    ]
    assert len(warnings) == 2, warnings
    assert f"ValidatingWebhookConfiguration/{name} (deleted) by another writer" in warnings[0], warnings
    assert f"ValidatingWebhookConfiguration/{name} (changed) by another writer" in warnings[1], warnings


def _same(obj: dict[str, Any]) -> dict[str, Any]:
    return obj


async def test_a_converted_crd_installed_after_registration_gets_its_conversion_at_the_next_check(
    fleet: Fleet, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="mcruntime.webhook")
    plane = fleet["cluster-3"]
    group = new_group()
    hub = mcr.Kind(f"{group}/v1", "Test")
    manager = _checking_manager(plane)
    mcr.webhook_managed_by(manager).for_(hub, resource="tests").with_conversion(
        hub="v1", to_hub={"v1alpha1": _same}, from_hub={"v1alpha1": _same}
    ).complete()
    async with serving(manager, [plane.name]), mcr.Cluster("reader", config_of(plane)) as reader:
        await install_crd(plane, kind_crd(group, ("v1alpha1", "v1"), storage="v1"))

        async def converted() -> bool:
            crd = await reader.client.get(CRD, f"tests.{group}")
            return bool(crd["spec"].get("conversion", {}).get("strategy") == "Webhook")

        await wait_until(converted, what="the CRD's conversion set by a periodic check")
        crd = await reader.client.get(CRD, f"tests.{group}")
        url = crd["spec"]["conversion"]["webhook"]["clientConfig"]["url"]
        assert url.endswith(f"/clusters/{plane.name}/convert/{group}/Test"), url
    assert any(
        f"CustomResourceDefinition/tests.{group} found; registering" in r.getMessage() for r in caplog.records
    )


def test_a_registration_holds_with_server_defaults_and_other_managers_webhooks() -> None:
    ours = {"webhooks": [{"name": "a", "clientConfig": {"url": "u"}, "rules": [{"operations": ["CREATE"]}]}]}
    defaulted = {
        "metadata": {"resourceVersion": "7"},
        "webhooks": [
            {"name": "other", "clientConfig": {"url": "x"}},
            {"name": "a", "clientConfig": {"url": "u"}, "rules": [{"operations": ["CREATE"], "scope": "*"}]},
        ],
    }
    assert _holds(defaulted, ours)
    moved = {
        "webhooks": [
            {"name": "a", "clientConfig": {"url": "elsewhere"}, "rules": [{"operations": ["CREATE"]}]}
        ]
    }
    assert not _holds(moved, ours)
    widened = {"webhooks": [{"name": "a", "clientConfig": {"url": "u"}, "rules": []}]}
    assert not _holds(widened, ours)
    assert not _holds({"webhooks": []}, ours)
