"""job-fanout's generated RBAC covers what it does: the deploy manifests apply exactly this."""

from __future__ import annotations

from typing import Any

import mcruntime as mcr
from job_fanout import build
from mcruntime.rbac import RBAC
from mcruntime_file import KubeconfigFileProvider

MAIN = mcr.kubeconfig_from_dict(
    {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "main", "cluster": {"server": "https://main.example:6443"}}],
        "users": [{"name": "u", "user": {"token": "not-a-real-token"}}],
        "contexts": [{"name": "main", "context": {"cluster": "main", "user": "u"}}],
        "current-context": "main",
    }
)


def _verbs(rbac: RBAC, role: Any, group: str, resource: str) -> list[str]:
    return next(
        (
            rule["verbs"]
            for rule in rbac.rules(role)
            if rule["apiGroups"] == [group] and resource in rule["resources"]
        ),
        [],
    )


def test_jobs_and_namespaces_are_written_in_every_cluster_and_tests_only_on_the_main_one() -> None:
    manager, _fanout = build(MAIN, KubeconfigFileProvider(), handle_signals=False)
    rbac = mcr.rbac_for(manager, name="job-fanout", namespace="job-fanout")
    for role in ("hub", "member"):
        assert _verbs(rbac, role, "batch", "jobs") == ["create", "delete", "get", "list", "watch"]
        assert _verbs(rbac, role, "", "namespaces") == ["create"]
    group = "demo.mcruntime.dev"
    assert _verbs(rbac, "hub", group, "tests/status") == ["get", "patch", "update"]
    assert _verbs(rbac, "member", group, "tests") == []
