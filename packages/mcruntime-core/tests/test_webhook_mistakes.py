"""Handler mistakes and leftovers that used to pass in silence, each now refused or named.

Called by real API servers: a validator that returns a verdict instead of
raising, a defaulter whose object the API server could not store, a
conversion whose exception text would reach the client, and the webhook
configuration an earlier version of the operator registered and this one no
longer serves.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
from typing import Any

import pytest
from kube_helpers import running, unique, wait_for
from webhook_helpers import (
    config_of,
    install_crd,
    kind_crd,
    make_test,
    new_group,
    serving,
    webhook_options,
)

import mcruntime as mcr
from mcruntime.rbac import Subject
from mcruntime.testing import ControlPlane, Fleet

VALIDATING = mcr.Kind("admissionregistration.k8s.io/v1", "ValidatingWebhookConfiguration")
MUTATING = mcr.Kind("admissionregistration.k8s.io/v1", "MutatingWebhookConfiguration")
CLUSTER_ROLE = mcr.Kind("rbac.authorization.k8s.io/v1", "ClusterRole")
CLUSTER_ROLE_BINDING = mcr.Kind("rbac.authorization.k8s.io/v1", "ClusterRoleBinding")


def _manager(
    plane: ControlPlane, options: mcr.WebhookOptions, config: mcr.ClusterConfig | None = None
) -> mcr.Manager:
    provider = mcr.StaticProvider({plane.name: config or config_of(plane)})
    return mcr.Manager(provider, handle_signals=False, webhook=options)


async def _fresh_kind(plane: ControlPlane) -> tuple[ControlPlane, mcr.Kind, mcr.Manager]:
    """A CRD of a group of its own installed in ``plane``, and a manager to hang a webhook for it on."""
    group = new_group()
    await install_crd(plane, kind_crd(group))
    return plane, mcr.Kind(f"{group}/v1", "Test"), _manager(plane, webhook_options())


async def _create(plane: ControlPlane, obj: dict[str, Any]) -> dict[str, Any]:
    async with mcr.Cluster("caller", config_of(plane)) as cluster:
        return await cluster.client.create(obj)


async def test_a_validator_that_returns_a_verdict_refuses_and_says_why(
    fleet: Fleet, caplog: pytest.LogCaptureFixture
) -> None:
    plane, kind, manager = await _fresh_kind(fleet["cluster-1"])

    async def validate(req: mcr.AdmissionRequest) -> Any:  # a mistake the types would catch
        return {"allowed": False}

    mcr.webhook_managed_by(manager).for_(kind).with_validator(validate).complete()
    async with serving(manager, [plane.name]):
        # The caller is told what to change, not only that the validator failed.
        refused = "the validator failed: TypeError: the validator returned a dict; it returns None to admit"
        with pytest.raises(mcr.APIError, match=refused):
            await _create(plane, make_test(kind, "verdict", "default", image="x"))
    [record] = [r for r in caplog.records if r.name == "mcruntime.webhook" and "validator" in r.getMessage()]
    assert record.levelno == logging.ERROR and "verdict" in record.getMessage()
    assert record.exc_info is not None
    assert "the validator returned a dict; it returns None to admit" in str(record.exc_info[1])


async def test_a_defaulter_whose_metadata_is_not_an_object_refuses_in_its_own_words(fleet: Fleet) -> None:
    plane, kind, manager = await _fresh_kind(fleet["cluster-1"])

    async def default(req: mcr.AdmissionRequest) -> dict[str, Any]:
        assert req.object is not None
        return {**req.object, "metadata": "nope"}

    mcr.webhook_managed_by(manager).for_(kind).with_defaulter(default).complete()
    async with serving(manager, [plane.name]):
        refused = "the defaulter failed: TypeError: the defaulter's object has a str as its metadata"
        with pytest.raises(mcr.APIError, match=refused):
            await _create(plane, make_test(kind, "bad-metadata", "default", image="x"))


async def test_a_defaulter_that_stores_what_json_cannot_hold_refuses_in_its_own_words(fleet: Fleet) -> None:
    plane, kind, manager = await _fresh_kind(fleet["cluster-1"])

    async def default(req: mcr.AdmissionRequest) -> None:
        assert req.object is not None
        req.object["spec"]["tags"] = {"a", "b"}  # a set: no JSON patch can carry it

    mcr.webhook_managed_by(manager).for_(kind).with_defaulter(default).complete()
    async with serving(manager, [plane.name]):
        with pytest.raises(mcr.APIError, match=r"the defaulter's object cannot be encoded as JSON: .*set"):
            await _create(plane, make_test(kind, "a-set", "default", image="x"))


async def test_a_validator_whose_await_was_cancelled_elsewhere_is_answered_not_dropped(
    fleet: Fleet, caplog: pytest.LogCaptureFixture
) -> None:
    """A CancelledError its task was not given is the handler's failure: answered per on_error, logged."""
    plane, kind, manager = await _fresh_kind(fleet["cluster-1"])

    async def validate(req: mcr.AdmissionRequest) -> None:
        shared: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        shared.cancel()  # a future some other task gave up on
        await shared

    mcr.webhook_managed_by(manager).for_(kind).with_validator(validate).complete()
    async with serving(manager, [plane.name]):
        with pytest.raises(mcr.APIError, match="the validator failed: CancelledError"):
            await _create(plane, make_test(kind, "cancelled", "default", image="x"))
    logged = [r for r in caplog.records if r.name == "mcruntime.webhook" and "validator" in r.getMessage()]
    assert logged and logged[0].levelno == logging.ERROR and logged[0].exc_info is not None


async def test_a_conversion_that_raises_shows_its_type_never_its_text(
    fleet: Fleet, caplog: pytest.LogCaptureFixture
) -> None:
    plane, group = fleet["cluster-2"], new_group()
    old, new = mcr.Kind(f"{group}/v1alpha1", "Test"), mcr.Kind(f"{group}/v1", "Test")
    await install_crd(plane, kind_crd(group, ("v1alpha1", "v1"), storage="v1"))
    manager = _manager(plane, webhook_options())

    def to_hub(obj: dict[str, Any]) -> dict[str, Any]:
        return obj

    def from_hub(obj: dict[str, Any]) -> dict[str, Any]:
        raise KeyError("password=hunter2")

    mcr.webhook_managed_by(manager).for_(new).with_conversion(
        hub="v1", to_hub={"v1alpha1": to_hub}, from_hub={"v1alpha1": from_hub}
    ).complete()
    name = unique("leaky")
    async with serving(manager, [plane.name]), mcr.Cluster("caller", config_of(plane)) as cluster:
        await cluster.client.create(make_test(new, name, "default", image="x"))
        with pytest.raises(mcr.APIError) as raised:
            await cluster.client.get(old, name, namespace="default")
        await cluster.client.delete(new, name, namespace="default")
    assert f"converting Test default/{name} from v1 to v1alpha1 failed: KeyError" in str(raised.value)
    assert "hunter2" not in str(raised.value)
    logged = [r for r in caplog.records if r.name == "mcruntime.webhook" and name in r.getMessage()]
    assert logged and all(r.levelno == logging.ERROR and r.exc_info is not None for r in logged)
    assert all("hunter2" not in r.getMessage() for r in logged)  # the text only in the traceback


async def _register_both(plane: ControlPlane, kind: mcr.Kind, configuration: str) -> None:
    """What an earlier version of the operator left: a validator and a defaulter, registered, kept."""
    earlier = _manager(plane, webhook_options(configuration_name=configuration, remove_on_disengage=False))

    async def allow(_req: mcr.AdmissionRequest) -> None:
        return None

    async def keep(_req: mcr.AdmissionRequest) -> None:
        return None

    mcr.webhook_managed_by(earlier).for_(kind).with_validator(allow).with_defaulter(keep).complete()
    async with serving(earlier, [plane.name]):
        pass


async def _remove(plane: ControlPlane, *objects: tuple[mcr.Kind, str]) -> None:
    async with mcr.Cluster("cleanup", config_of(plane)) as cluster:
        for kind, name in objects:
            with contextlib.suppress(mcr.NotFound):
                await cluster.client.delete(kind, name)


async def test_an_earlier_versions_mutating_configuration_is_emptied(fleet: Fleet) -> None:
    plane, group = fleet["cluster-2"], new_group()
    kind = mcr.Kind(f"{group}/v1", "Test")
    await install_crd(plane, kind_crd(group))
    configuration = unique("mcruntime-test")
    await _register_both(plane, kind, configuration)
    try:
        # The next version validates only: its CA is new, so the defaulter left behind would
        # refuse every Test with an unknown-authority error, while /readyz says all is well.
        manager = _manager(plane, webhook_options(configuration_name=configuration))

        async def deny(_req: mcr.AdmissionRequest) -> None:
            raise mcr.Denied("validated by the new version")

        mcr.webhook_managed_by(manager).for_(kind).with_validator(deny).complete()
        async with serving(manager, [plane.name]), mcr.Cluster("check", config_of(plane)) as cluster:
            left = await cluster.client.get(MUTATING, configuration)
            assert not left.get("webhooks")
            assert plane.name not in manager.webhook.registrar.failing
            with pytest.raises(mcr.Forbidden, match="validated by the new version"):
                await cluster.client.create(make_test(kind, "after", "default", image="x"))
    finally:
        await _remove(plane, (MUTATING, configuration), (VALIDATING, configuration))


async def _upgraded_to_validator_only(plane: ControlPlane) -> tuple[str, mcr.Manager, Subject]:
    """An earlier version's validator and defaulter registered; the next one, validating only, on a
    token user with no permission yet: its configuration name, manager and subject."""
    group = new_group()
    kind = mcr.Kind(f"{group}/v1", "Test")
    await install_crd(plane, kind_crd(group))
    configuration = unique("mcruntime-test")
    await _register_both(plane, kind, configuration)
    manager, subject = _limited(
        plane, webhook_options(configuration_name=configuration, remove_on_disengage=False)
    )

    async def allow(_req: mcr.AdmissionRequest) -> None:
        return None

    mcr.webhook_managed_by(manager).for_(kind).with_validator(allow).complete()
    return configuration, manager, subject


async def test_under_its_generated_rbac_a_validator_only_manager_empties_an_earlier_defaulter(
    fleet: Fleet,
) -> None:
    # Upgrading an operator that dropped its defaulter: the generated RBAC grants nothing on
    # every mutating configuration, but get and patch on this one, so the leftover (which
    # refuses every write it matches) is emptied, not left in place with a DEBUG line.
    plane = fleet["cluster-2"]
    configuration, manager, subject = await _upgraded_to_validator_only(plane)
    grants = await _grant(plane, _generated(manager, subject))
    try:
        registrar = manager.webhook.registrar
        registrar.backoff = mcr.Backoff(base=0.05, cap=0.5)
        async with running(manager), mcr.Cluster("check", config_of(plane)) as cluster:

            async def emptied() -> bool:
                return not (await cluster.client.get(MUTATING, configuration)).get("webhooks")

            await wait_for(emptied)
            await wait_for(lambda: registrar.applied.get(plane.name, 0) >= 1)
            assert plane.name not in registrar.failing
            engaged = await manager.get_cluster(plane.name)
            assert engaged.health.missing_permissions == ()
    finally:
        await _remove(plane, (MUTATING, configuration), (VALIDATING, configuration), *grants)


@pytest.mark.parametrize("may_read", [True, False], ids=["may-read", "may-not-read"])
async def test_a_leftover_this_identity_may_not_patch_is_named_and_costs_no_health(
    fleet: Fleet, may_read: bool
) -> None:
    plane = fleet["cluster-3"]
    configuration, manager, subject = await _upgraded_to_validator_only(plane)
    # The generated RBAC without its rules on single objects (nothing on mutating
    # configurations), and with may_read a read of them: enough to see the leftover, not to
    # change it.
    objects = _generated(manager, subject, named=False)
    if may_read:
        reader = unique("reads-mutating")
        rules = [
            {"apiGroups": [MUTATING.group], "resources": ["mutatingwebhookconfigurations"], "verbs": ["get"]}
        ]
        objects.append(
            {
                "apiVersion": CLUSTER_ROLE.api_version,
                "kind": "ClusterRole",
                "metadata": {"name": reader},
                "rules": rules,
            }
        )
        objects.append(
            {
                "apiVersion": CLUSTER_ROLE_BINDING.api_version,
                "kind": "ClusterRoleBinding",
                "metadata": {"name": reader},
                "roleRef": {"apiGroup": CLUSTER_ROLE.group, "kind": "ClusterRole", "name": reader},
                "subjects": [subject.as_json()],
            }
        )
    grants = await _grant(plane, objects)
    try:
        registrar = manager.webhook.registrar
        registrar.backoff = mcr.Backoff(base=0.05, cap=0.5)
        async with running(manager):
            if may_read:
                await wait_for(lambda: plane.name in registrar.failing)
                assert "holds webhooks of an earlier version" in registrar.failing[plane.name]
                assert "may not patch it" in registrar.failing[plane.name]
                lines = await manager.webhook.readiness()
                assert (f"webhook:registration:{plane.name}", registrar.failing[plane.name], False) in lines
            else:  # nothing it could see: registered, and quiet about it
                await wait_for(lambda: registrar.applied.get(plane.name, 0) >= 1)
                assert plane.name not in registrar.failing
            # The validating configuration was applied all the same, and nothing was refused:
            # the access review asked first, so no 403 marks the cluster as missing a permission.
            async with mcr.Cluster("check", config_of(plane)) as cluster:
                current = await cluster.client.get(VALIDATING, configuration)
                assert current["webhooks"][0]["clientConfig"]["caBundle"] == _bundle(manager)
            engaged = await manager.get_cluster(plane.name)
            assert engaged.health.missing_permissions == ()
    finally:
        await _remove(plane, (MUTATING, configuration), (VALIDATING, configuration), *grants)


async def test_a_configuration_kind_it_may_not_write_leaves_the_other_current(fleet: Fleet) -> None:
    plane, group = fleet["cluster-2"], new_group()
    kind = mcr.Kind(f"{group}/v1", "Test")
    await install_crd(plane, kind_crd(group))
    configuration = unique("mcruntime-test")
    manager, subject = _limited(
        plane, webhook_options(configuration_name=configuration, remove_on_disengage=False)
    )

    async def allow(_req: mcr.AdmissionRequest) -> None:
        return None

    async def default(req: mcr.AdmissionRequest) -> dict[str, Any] | None:
        return req.object

    mcr.webhook_managed_by(manager).for_(kind).with_validator(allow).with_defaulter(default).complete()
    # The generated RBAC, less everything on validating configurations (a role edited by hand).
    objects = _generated(manager, subject)
    for obj in objects:
        for rule in obj.get("rules", []):
            rule["resources"] = [
                r for r in rule.get("resources", []) if r != "validatingwebhookconfigurations"
            ]
        if "rules" in obj:
            obj["rules"] = [rule for rule in obj["rules"] if rule.get("resources") != []]
    grants = await _grant(plane, objects)
    try:
        registrar = manager.webhook.registrar
        registrar.backoff = mcr.Backoff(base=0.05, cap=0.5)
        async with running(manager):
            await wait_for(lambda: plane.name in registrar.failing)
            assert "validatingwebhookconfigurations" in registrar.failing[plane.name]
            # The refused kind stopped nothing else: the mutating one carries this run's CA.
            async with mcr.Cluster("check", config_of(plane)) as cluster:
                current = await cluster.client.get(MUTATING, configuration)
                assert current["webhooks"][0]["clientConfig"]["caBundle"] == _bundle(manager)
    finally:
        await _remove(plane, (MUTATING, configuration), (VALIDATING, configuration), *grants)


def _limited(plane: ControlPlane, options: mcr.WebhookOptions) -> tuple[mcr.Manager, Subject]:
    """A manager whose identity is a token user with no permission yet, and that user as a subject."""
    user = plane.add_token_user(unique("limited"), cluster_admin=False)
    config = mcr.kubeconfig_from_dict(plane.kubeconfig(user))
    return _manager(plane, options, config=config), Subject("User", user.name)


def _generated(manager: mcr.Manager, subject: Subject, *, named: bool = True) -> list[dict[str, Any]]:
    """The cluster-wide part of the member RBAC generated for ``manager``, bound to ``subject``.

    Without ``named``, the rules on single objects (``resourceNames``) are left out: narrower
    RBAC than generated, as a hand-written or older policy would be.
    """
    rbac = mcr.rbac_for(manager, name=unique("limited"), namespace="default", member_subject=subject)
    objects = [obj for obj in rbac.objects("member") if obj["kind"] in ("ClusterRole", "ClusterRoleBinding")]
    if not named:
        for obj in objects:
            if obj["kind"] == "ClusterRole":
                obj["rules"] = [rule for rule in obj["rules"] if "resourceNames" not in rule]
    return objects


async def _grant(plane: ControlPlane, objects: list[dict[str, Any]]) -> list[tuple[mcr.Kind, str]]:
    """Create ``objects`` as the admin; what to delete afterwards."""
    async with mcr.Cluster("admin", config_of(plane)) as admin:
        for obj in objects:
            await admin.client.create(obj)
    return [(mcr.Kind(obj["apiVersion"], obj["kind"]), obj["metadata"]["name"]) for obj in objects]


def _bundle(manager: mcr.Manager) -> str:
    bundle = manager.webhook.ca_bundle()
    assert bundle is not None
    return base64.b64encode(bundle).decode("ascii")


async def test_a_defaulter_only_manager_removes_its_configuration_under_its_generated_rbac(
    fleet: Fleet, caplog: pytest.LogCaptureFixture
) -> None:
    plane, group = fleet["cluster-1"], new_group()
    kind = mcr.Kind(f"{group}/v1", "Test")
    await install_crd(plane, kind_crd(group))
    configuration = unique("mcruntime-test")
    manager, subject = _limited(plane, webhook_options(configuration_name=configuration))  # removes on stop

    async def keep(_req: mcr.AdmissionRequest) -> None:
        return None

    mcr.webhook_managed_by(manager).for_(kind).with_defaulter(keep).complete()
    grants = await _grant(plane, _generated(manager, subject))
    try:
        async with serving(manager, [plane.name]), mcr.Cluster("check", config_of(plane)) as cluster:
            assert (await cluster.client.get(MUTATING, configuration))["webhooks"]
        # Stopped: its one configuration removed, and nothing asked of the kind it never had.
        async with mcr.Cluster("check", config_of(plane)) as cluster:
            assert await cluster.client.get_or_none(MUTATING, configuration) is None
        assert not [r for r in caplog.records if "forbidden" in r.getMessage() or "failed" in r.getMessage()]
    finally:
        await _remove(plane, (MUTATING, configuration), *grants)
