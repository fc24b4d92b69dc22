"""RBAC derived from a built manager: rules per role, merged and stable (no cluster needed)."""

from __future__ import annotations

import logging
from typing import Any

import pytest
import yaml

import mcruntime as mcr
from mcruntime._base.kind import Resource
from mcruntime._client.permissions import Denials, refused_by_authorization, verb_of
from mcruntime.rbac import RBAC, Subject, render_rbac_yaml

CONFIG = mcr.kubeconfig_from_dict(
    {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "hub", "cluster": {"server": "https://hub.example:6443"}}],
        "users": [{"name": "u", "user": {"token": "not-a-real-token"}}],
        "contexts": [{"name": "hub", "context": {"cluster": "hub", "user": "u"}}],
        "current-context": "hub",
    }
)
WIDGET = mcr.Kind("example.com/v1", "Widget")
JOB = mcr.Kind("batch/v1", "Job")
CONFIGMAP = mcr.Kind("v1", "ConfigMap")
DEPLOYMENT = mcr.Kind("apps/v1", "Deployment")
SECRET = mcr.Kind("v1", "Secret")
READ = ["get", "list", "watch"]


async def _reconcile(_request: mcr.Request) -> None:
    return None


def _verbs(
    rbac: RBAC,
    role: Any,
    group: str,
    resource: str,
    namespace: str | None = None,
    names: list[str] | None = None,
) -> list[str]:
    """The verbs ``role`` grants on ``group``/``resource`` (one rule each, after merging), on every object or ``names``."""
    found = [
        rule["verbs"]
        for rule in rbac.rules(role, namespace)
        if rule["apiGroups"] == [group]
        and resource in rule["resources"]
        and rule.get("resourceNames") == names
    ]
    assert len(found) <= 1, f"{resource} is in several rules: {found}"
    return found[0] if found else []


def _fanout_manager(**options: Any) -> mcr.Manager:
    """The job-fanout shape: a hub kind fanned out as Jobs to every member."""
    manager = mcr.Manager(mcr.StaticProvider({}), local=CONFIG, handle_signals=False, **options)
    (
        mcr.controller_managed_by(manager)
        .named("fanout")
        .for_(WIDGET, clusters=mcr.LOCAL_ONLY)
        .watches(JOB, mcr.enqueue_for_object(), clusters=mcr.EVERY_CLUSTER)
        .writes(JOB, "create", "delete", clusters=mcr.PROVIDER_ONLY)
        .complete(_reconcile)
    )
    return manager


def test_the_for_kind_is_read_updated_and_its_status_written_where_it_is_watched() -> None:
    rbac = mcr.rbac_for(_fanout_manager(), name="fanout", namespace="ops")
    assert rbac.roles == ["hub", "member"]
    assert _verbs(rbac, "hub", "example.com", "widgets") == ["get", "list", "patch", "update", "watch"]
    assert _verbs(rbac, "hub", "example.com", "widgets/status") == ["get", "patch", "update"]
    assert _verbs(rbac, "hub", "example.com", "widgets/finalizers") == ["update"]
    assert _verbs(rbac, "member", "example.com", "widgets") == []


def test_watched_kinds_are_read_in_the_clusters_their_source_selects_and_declared_writes_added() -> None:
    rbac = mcr.rbac_for(_fanout_manager(), name="fanout", namespace="ops")
    assert _verbs(rbac, "hub", "batch", "jobs") == READ
    assert _verbs(rbac, "member", "batch", "jobs") == ["create", "delete", "get", "list", "watch"]


def test_events_are_recorded_in_every_cluster_a_request_can_name() -> None:
    # The fanout's Jobs are watched in every cluster and enqueue themselves: requests of members.
    fanout = mcr.rbac_for(_fanout_manager(), name="fanout", namespace="ops")
    hub_only = mcr.Manager(mcr.StaticProvider({}), local=CONFIG, handle_signals=False)
    mcr.controller_managed_by(hub_only).for_(WIDGET, clusters=mcr.LOCAL_ONLY).owns(
        DEPLOYMENT, clusters=mcr.LOCAL_ONLY
    ).complete(_reconcile)
    # A mapper from hub objects may name any cluster (the secret-mirror shape).
    mapped = mcr.Manager(mcr.StaticProvider({}), local=CONFIG, handle_signals=False)
    mcr.controller_managed_by(mapped).named("mirror").watches(
        SECRET, mcr.enqueue_mapped(lambda _cluster, _obj: []), clusters=mcr.LOCAL_ONLY
    ).complete(_reconcile)
    for group in ("", "events.k8s.io"):
        assert _verbs(fanout, "hub", group, "events") == ["create", "patch"]
        assert _verbs(fanout, "member", group, "events") == ["create", "patch"]
        only = mcr.rbac_for(hub_only, name="only", namespace="ops")
        assert (_verbs(only, "hub", group, "events"), _verbs(only, "member", group, "events")) == (
            ["create", "patch"],
            [],
        )
        either = mcr.rbac_for(mapped, name="mapped", namespace="ops")
        assert _verbs(either, "member", group, "events") == ["create", "patch"]


def test_owned_kinds_get_every_write_in_the_for_kinds_clusters_by_default() -> None:
    manager = mcr.Manager(mcr.StaticProvider({}), handle_signals=False)
    mcr.controller_managed_by(manager).for_(WIDGET).owns(DEPLOYMENT).complete(_reconcile)
    rbac = mcr.rbac_for(manager, name="widgets", namespace="ops")
    assert rbac.roles == ["member"]  # with a provider, sources default to its clusters
    assert _verbs(rbac, "member", "apps", "deployments") == [
        "create",
        "delete",
        "get",
        "list",
        "patch",
        "update",
        "watch",
    ]


def test_without_a_provider_everything_is_the_hubs() -> None:
    manager = mcr.Manager(local=CONFIG, handle_signals=False)
    mcr.controller_managed_by(manager).for_(CONFIGMAP).reads(DEPLOYMENT).complete(_reconcile)
    rbac = mcr.rbac_for(manager, name="cm", namespace="ops")
    assert rbac.roles == ["hub"]
    assert _verbs(rbac, "hub", "apps", "deployments") == READ
    assert _verbs(rbac, "hub", "", "configmaps") == ["get", "list", "patch", "update", "watch"]


def test_a_namespaced_cache_read_is_a_role_only_where_the_cache_is_scoped_to_it() -> None:
    def secrets_read(options: mcr.ClusterOptions | None) -> tuple[list[str], list[str]]:
        manager = mcr.Manager(local=CONFIG, handle_signals=False, cluster_options=options)
        mcr.controller_managed_by(manager).for_(CONFIGMAP).reads(SECRET, namespace="ops").complete(_reconcile)
        rbac = mcr.rbac_for(manager, name="cm", namespace="ops")
        return _verbs(rbac, "hub", "", "secrets"), _verbs(rbac, "hub", "", "secrets", "ops")

    # The informer a cache read starts lists cluster-wide: a Role alone would stall it on a 403.
    assert secrets_read(None) == (READ, [])
    assert secrets_read(mcr.ClusterOptions(cache_namespace="ops")) == ([], READ)
    scoped = mcr.ClusterOptions(cache=mcr.CacheOptions(by_object={SECRET: mcr.ByObject(namespaces=["ops"])}))
    assert secrets_read(scoped) == ([], READ)
    assert secrets_read(mcr.ClusterOptions(cache_namespace="other")) == (READ, [])


def test_leader_election_needs_its_lease_verbs_in_its_namespace_only() -> None:
    election = mcr.LeaderElectionConfig(name="fanout", namespace="ops")
    rbac = mcr.rbac_for(_fanout_manager(leader_election=election), name="fanout", namespace="ops")
    assert rbac.namespaces("hub") == ["ops"]
    assert _verbs(rbac, "hub", "coordination.k8s.io", "leases", "ops") == ["create", "get", "update"]
    assert _verbs(rbac, "hub", "coordination.k8s.io", "leases") == []


def test_sharding_also_lists_watches_and_deletes_leases() -> None:
    sharding = mcr.ShardedCoordinator(mcr.ShardingConfig(name="fanout", namespace="shards"))
    rbac = mcr.rbac_for(_fanout_manager(coordinator=sharding), name="fanout", namespace="ops")
    verbs = _verbs(rbac, "hub", "coordination.k8s.io", "leases", "shards")
    assert verbs == ["create", "delete", "get", "list", "update", "watch"]


def test_the_secret_provider_reads_its_secrets_in_its_namespace() -> None:
    provider = mcr.KubeconfigSecretProvider(CONFIG, "fleet")
    manager = mcr.Manager(provider, local=CONFIG, handle_signals=False)
    rbac = mcr.rbac_for(manager, name="x", namespace="ops")
    assert _verbs(rbac, "hub", "", "secrets", "fleet") == READ
    assert _verbs(rbac, "hub", "", "secrets") == []


def test_a_multi_provider_declares_what_its_providers_declare() -> None:
    inner = mcr.KubeconfigSecretProvider(CONFIG, "fleet")
    manager = mcr.Manager(mcr.MultiProvider({"a": inner, "b": mcr.StaticProvider({})}), handle_signals=False)
    rbac = mcr.rbac_for(manager, name="x", namespace="ops")
    assert _verbs(rbac, "hub", "", "secrets", "fleet") == READ


class _WebhookRegistrar:
    """A runnable that declares what it needs, as webhook registration will."""

    async def start(self) -> None:
        return None

    def rbac_rules(self) -> list[mcr.Permission]:
        kind = mcr.Kind("admissionregistration.k8s.io/v1", "ValidatingWebhookConfiguration")
        return [mcr.Permission(kind, ("get", "patch"), "member")]


def test_a_runnable_that_declares_rules_has_them_merged() -> None:
    manager = _fanout_manager()
    manager.add(_WebhookRegistrar())
    rbac = mcr.rbac_for(manager, name="fanout", namespace="ops")
    group = "admissionregistration.k8s.io"
    assert _verbs(rbac, "member", group, "validatingwebhookconfigurations") == ["get", "patch"]


def test_declared_permissions_merge_and_a_cluster_wide_grant_covers_a_namespaced_one() -> None:
    manager = _fanout_manager()
    manager.declare_rbac(
        mcr.Permission(CONFIGMAP, ("get",), "hub", namespace="ops"),
        mcr.Permission(CONFIGMAP, ("get", "list"), "hub"),
        mcr.Permission(CONFIGMAP, ("create",), "hub", namespace="ops"),
    )
    rbac = mcr.rbac_for(manager, name="fanout", namespace="ops")
    assert _verbs(rbac, "hub", "", "configmaps") == ["get", "list"]
    assert _verbs(rbac, "hub", "", "configmaps", "ops") == ["create"]


def test_a_named_grant_is_its_own_rule_unless_a_grant_on_every_object_covers_it() -> None:
    manager = _fanout_manager()
    manager.declare_rbac(
        mcr.Permission(CONFIGMAP, ("get", "patch"), "hub", resource_names=("b", "a")),
        mcr.Permission(CONFIGMAP, ("get",), "hub", namespace="ops", resource_names=("c",)),
        mcr.Permission(CONFIGMAP, ("get",), "hub", namespace="ops"),
        mcr.Permission(CONFIGMAP, ("update",), "hub", namespace="ops", resource_names=("c",)),
    )
    rbac = mcr.rbac_for(manager, name="fanout", namespace="ops")
    assert _verbs(rbac, "hub", "", "configmaps", names=["a", "b"]) == ["get", "patch"]
    assert _verbs(rbac, "hub", "", "configmaps", "ops") == ["get"]
    assert _verbs(rbac, "hub", "", "configmaps", "ops", names=["c"]) == ["update"]  # get: covered
    assert "hub cluster-wide get,patch configmaps named a,b (core)" in rbac.explain("hub")


def test_resource_names_must_be_a_tuple_of_names() -> None:
    with pytest.raises(TypeError, match="resource_names is a tuple of names"):
        mcr.Permission(CONFIGMAP, ("get",), resource_names="one")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="resource_names must be non-empty names"):
        mcr.Permission(CONFIGMAP, ("get",), resource_names=("",))


def test_the_yaml_is_the_same_whatever_order_controllers_were_built_in() -> None:
    def build(order: list[mcr.Kind]) -> str:
        manager = mcr.Manager(mcr.StaticProvider({}), local=CONFIG, handle_signals=False)
        for kind in order:
            mcr.controller_managed_by(manager).named(kind.kind.lower()).for_(kind).complete(_reconcile)
        return render_rbac_yaml(manager, "app", "ops", "app-sa")

    assert build([CONFIGMAP, JOB, WIDGET]) == build([WIDGET, CONFIGMAP, JOB])


def test_the_yaml_binds_each_role_to_its_subject() -> None:
    election = mcr.LeaderElectionConfig(name="fanout", namespace="ops")
    text = render_rbac_yaml(_fanout_manager(leader_election=election), "fanout", "ops", "fanout-sa")
    assert text.startswith("# hub: ")
    documents = list(yaml.safe_load_all(text))
    kinds = [(doc["kind"], doc["metadata"]["name"], doc["metadata"].get("namespace")) for doc in documents]
    assert kinds == [
        ("ClusterRole", "fanout-hub", None),
        ("ClusterRoleBinding", "fanout-hub", None),
        ("Role", "fanout-hub", "ops"),
        ("RoleBinding", "fanout-hub", "ops"),
        ("Namespace", "ops", None),
        ("ServiceAccount", "fanout-sa", "ops"),
        ("ClusterRole", "fanout-member", None),
        ("ClusterRoleBinding", "fanout-member", None),
    ]
    subject = {"kind": "ServiceAccount", "name": "fanout-sa", "namespace": "ops"}
    assert all(doc["subjects"] == [subject] for doc in documents if doc["kind"].endswith("Binding"))


def test_explain_says_why_each_permission_is_there() -> None:
    election = mcr.LeaderElectionConfig(name="fanout", namespace="ops")
    lines = mcr.rbac_for(_fanout_manager(leader_election=election), name="fanout", namespace="ops").explain()
    assert "member cluster-wide create,delete jobs (batch)  # controller fanout: declared" in lines
    assert (
        "hub ops create,get,update leases (coordination.k8s.io)  # leader election (Lease ops/fanout)"
        in lines
    )


def test_a_declared_permission_without_a_reason_is_explained_by_where_it_came_from() -> None:
    manager = _fanout_manager()
    manager.declare_rbac(
        mcr.Permission(CONFIGMAP, ("create",), "hub", namespace="ops"),
        mcr.Permission(CONFIGMAP, ("get",), "hub", reason="reads its settings"),
    )
    lines = mcr.rbac_for(manager, name="fanout", namespace="ops").explain()
    assert "hub ops create configmaps (core)  # Manager.declare_rbac" in lines
    assert "hub cluster-wide get configmaps (core)  # reads its settings" in lines


def test_a_member_subject_of_its_own_is_bound_without_a_service_account() -> None:
    rbac = mcr.rbac_for(
        _fanout_manager(), name="fanout", namespace="ops", member_subject=Subject("User", "fleet-bot")
    )
    members = rbac.objects("member")
    assert [obj["kind"] for obj in members] == ["ClusterRole", "ClusterRoleBinding"]
    assert members[1]["subjects"] == [
        {"kind": "User", "name": "fleet-bot", "apiGroup": "rbac.authorization.k8s.io"}
    ]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"name": "Bad_Name", "namespace": "ops"}, "name 'Bad_Name'"),
        ({"name": "ok", "namespace": "no.dots"}, "namespace 'no.dots'"),
        ({"name": "ok", "namespace": "ops", "service_account": ""}, "service_account ''"),
        ({"name": "ok", "namespace": "n" * 64}, "is not a DNS label: 1 to 63 characters"),
        (
            {"name": "ok", "namespace": "ops", "service_account": "a..b"},
            "service_account 'a..b' is not a DNS",
        ),
        (
            {"name": "ok", "namespace": "ops", "service_account": "a.-b"},
            "service_account 'a.-b' is not a DNS",
        ),
        ({"name": "x" * 251 + ".ok", "namespace": "ops"}, "is not a DNS subdomain: 1 to 253 characters"),
    ],
)
def test_bad_names_are_refused_naming_the_argument(options: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        mcr.rbac_for(_fanout_manager(), **options)  # type: ignore[arg-type]


def test_a_subdomains_parts_may_be_longer_than_a_label_as_the_api_server_allows() -> None:
    name = "w" * 70  # a ServiceAccount and a ClusterRole the API server accepts (IsDNS1123Subdomain)
    rbac = mcr.rbac_for(_fanout_manager(), name=name, namespace="ops")
    assert any(obj["metadata"]["name"] == f"{name}-member" for obj in rbac.objects("member"))


def test_a_bad_declared_verb_is_a_builder_error_naming_it() -> None:
    manager = mcr.Manager(local=CONFIG, handle_signals=False)
    builder = mcr.controller_managed_by(manager).for_(CONFIGMAP).writes(JOB, "Create")
    with pytest.raises(mcr.BuilderError, match="'Create' is not a verb"):
        builder.complete(_reconcile)


def test_a_permission_refuses_a_string_of_verbs() -> None:
    with pytest.raises(TypeError, match="not the string 'get'"):
        mcr.Permission(CONFIGMAP, "get")  # type: ignore[arg-type]


def test_plurals_follow_the_api_servers_names() -> None:
    names = {
        kind: mcr.Permission(mcr.Kind("v1", kind), ("get",)).rest_name
        for kind in ("Ingress", "NetworkPolicy", "Endpoints", "Gateway", "Pod")
    }
    assert names == {
        "Ingress": "ingresses",
        "NetworkPolicy": "networkpolicies",
        "Endpoints": "endpoints",
        "Gateway": "gateways",
        "Pod": "pods",
    }


# --- missing permissions --------------------------------------------------------------------

SECRETS = Resource("", "v1", "secrets", "Secret", namespaced=True)


def test_a_denial_is_logged_once_and_cleared_by_the_same_request_succeeding(
    caplog: pytest.LogCaptureFixture,
) -> None:
    denials = Denials("east")
    with caplog.at_level(logging.INFO, logger="mcruntime.permissions"):
        for _ in range(3):
            denials.denied("list", SECRETS, "fleet")
        assert denials.describe() == ("cannot list Secret (secrets) in namespace 'fleet'",)
        denials.allowed("list", SECRETS, "other")
        assert denials.describe() != ()
        denials.allowed("list", SECRETS, "fleet")
    assert denials.describe() == ()
    messages = [record.getMessage() for record in caplog.records]
    assert len([m for m in messages if "forbidden" in m]) == 1
    assert any("allowed again: list Secret" in m for m in messages)


def test_a_cluster_wide_success_clears_every_namespace_of_the_same_verb() -> None:
    denials = Denials("east")
    denials.denied("watch", SECRETS, "a")
    denials.denied("watch", SECRETS, "b")
    denials.denied("get", SECRETS, "a", subresource="status")
    denials.allowed("watch", SECRETS, None)
    assert denials.describe() == ("cannot get Secret (secrets/status) in namespace 'a'",)


def test_a_denial_nothing_repeats_is_forgotten_after_its_ttl() -> None:
    denials = Denials("east", ttl=0.0)
    denials.denied("create", SECRETS, "a")
    assert denials.describe() == ()


def test_verbs_of_requests() -> None:
    assert [verb_of("GET", "x"), verb_of("GET", None), verb_of("POST", None)] == ["get", "list", "create"]
    assert [verb_of("PUT", "x"), verb_of("PATCH", "x"), verb_of("DELETE", "x")] == [
        "update",
        "patch",
        "delete",
    ]
    assert verb_of("DELETE", None) == "deletecollection"


def test_only_the_authorizers_403_is_a_missing_permission() -> None:
    rbac = 'configmaps is forbidden: User "system:serviceaccount:ops:app" cannot list resource "configmaps"'
    terminating = 'configmaps "x" is forbidden: unable to create new content in namespace ops because it is being terminated'
    webhook = 'admission webhook "deny.example.com" denied the request: no'
    assert refused_by_authorization({"kind": "Status", "message": rbac})
    assert not refused_by_authorization({"kind": "Status", "message": terminating})
    assert not refused_by_authorization({"kind": "Status", "message": webhook})
    assert not refused_by_authorization(b"<html>403</html>")


async def _accept(_request: mcr.AdmissionRequest) -> None:
    return None


def test_a_registering_webhook_server_may_install_its_configurations_in_every_cluster() -> None:
    manager = _fanout_manager()
    mcr.webhook_managed_by(manager).for_(WIDGET).with_validator(_accept).with_conversion(
        hub="v1", to_hub={"v1alpha1": dict}, from_hub={"v1alpha1": dict}
    ).complete()
    rbac = mcr.rbac_for(manager, name="fanout", namespace="ops")
    for role in ("hub", "member"):
        configurations = _verbs(rbac, role, "admissionregistration.k8s.io", "validatingwebhookconfigurations")
        assert configurations == ["create", "get", "patch", "update"]
        assert _verbs(rbac, role, "admissionregistration.k8s.io", "mutatingwebhookconfigurations") == []
        # An earlier version's defaulters, left behind: this one may empty that one object.
        leftover = _verbs(
            rbac,
            role,
            "admissionregistration.k8s.io",
            "mutatingwebhookconfigurations",
            names=["mcruntime-webhooks"],
        )
        assert leftover == ["get", "patch"]
        assert _verbs(rbac, role, "apiextensions.k8s.io", "customresourcedefinitions") == ["get", "patch"]


def test_a_webhook_server_on_provided_certificates_registers_nothing(tmp_path: Any) -> None:
    manager = mcr.Manager(
        mcr.StaticProvider({}),
        local=CONFIG,
        handle_signals=False,
        webhook=mcr.WebhookOptions(cert_dir=str(tmp_path)),
    )
    mcr.webhook_managed_by(manager).for_(WIDGET).with_validator(_accept).complete()
    rbac = mcr.rbac_for(manager, name="fanout", namespace="ops")
    assert _verbs(rbac, "hub", "admissionregistration.k8s.io", "validatingwebhookconfigurations") == []
