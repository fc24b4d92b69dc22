"""Each provider package declares its own reads on the hub, and ``rbac_for`` includes them."""

from __future__ import annotations

from pathlib import Path

import pytest

import mcruntime as mcr
from mcruntime_capi import ClusterAPIProvider
from mcruntime_clusterprofile import ClusterProfileProvider
from mcruntime_file import KubeconfigFileProvider
from mcruntime_kind import KindProvider
from mcruntime_kubefed import KubeFedProvider
from mcruntime_namespace import NamespaceProvider

HUB = mcr.kubeconfig_from_dict(
    {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "hub", "cluster": {"server": "https://hub.example:6443"}}],
        "users": [{"name": "u", "user": {"token": "not-a-real-token"}}],
        "contexts": [{"name": "hub", "context": {"cluster": "hub", "user": "u"}}],
        "current-context": "hub",
    }
)
READ = ["get", "list", "watch"]


def _hub_rules(
    provider: mcr.Provider,
) -> dict[str | None, list[tuple[str, tuple[str, ...], tuple[str, ...]]]]:
    """The hub's rules per namespace (``None``: the ClusterRole), as (group, resources, verbs)."""
    rbac = mcr.rbac_for(mcr.Manager(provider, handle_signals=False), name="fleet", namespace="ops")
    scopes: list[str | None] = [None, *rbac.namespaces("hub")]
    return {
        scope: [
            (rule["apiGroups"][0], tuple(rule["resources"]), tuple(rule["verbs"]))
            for rule in rbac.rules("hub", scope)
        ]
        for scope in scopes
        if rbac.rules("hub", scope)
    }


def test_cluster_api_reads_clusters_and_their_secrets_in_its_namespace() -> None:
    rules = _hub_rules(ClusterAPIProvider(HUB, namespace="capi"))
    assert rules == {
        "capi": [
            ("", ("secrets",), ("get", "list", "watch")),
            ("cluster.x-k8s.io", ("clusters",), ("get", "list", "watch")),
        ]
    }


def test_cluster_api_without_a_namespace_reads_cluster_wide() -> None:
    assert list(_hub_rules(ClusterAPIProvider(HUB))) == [None]


def test_kubefed_reads_its_members_and_their_token_secrets() -> None:
    rules = _hub_rules(KubeFedProvider(HUB))
    assert rules == {
        "kube-federation-system": [
            ("", ("secrets",), ("get", "list", "watch")),
            ("core.kubefed.io", ("kubefedclusters",), ("get", "list", "watch")),
        ]
    }


def test_cluster_profiles_are_read_where_they_live(tmp_path: Path) -> None:
    rules = _hub_rules(ClusterProfileProvider(HUB, tmp_path / "access.json", namespace="profiles"))
    assert rules == {"profiles": [("multicluster.x-k8s.io", ("clusterprofiles",), ("get", "list", "watch"))]}


def test_the_namespace_provider_watches_namespaces_on_its_host_in_the_member_role() -> None:
    # The host gets the member role (its namespaces are the clusters), hub or not.
    assert _hub_rules(NamespaceProvider(HUB)) == {}
    rbac = mcr.rbac_for(
        mcr.Manager(NamespaceProvider(HUB), handle_signals=False), name="fleet", namespace="ops"
    )
    assert {"apiGroups": [""], "resources": ["namespaces"], "verbs": ["get", "list", "watch"]} in rbac.rules(
        "member"
    )


@pytest.mark.parametrize("provider", [KubeconfigFileProvider, KindProvider], ids=["file", "kind"])
def test_providers_that_read_no_cluster_need_nothing_on_the_hub(provider: type[mcr.Provider]) -> None:
    assert _hub_rules(provider()) == {}
