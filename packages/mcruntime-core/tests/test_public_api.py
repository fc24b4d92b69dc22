"""The public surface, pinned: what ``mcruntime`` exports is a decision, not an accident.

A name added to or removed from ``__all__`` fails this test until the list below
changes too, in the same commit as the CHANGELOG line that announces it. Every
exported name carries documentation: a docstring for classes and functions, an
attribute docstring (the string literal after the assignment, which the API
reference reads) for aliases and constants.
"""

from __future__ import annotations

import ast
import inspect
import itertools
import sys
from pathlib import Path

import pytest

import mcruntime
import mcruntime.testing
from mcruntime import (
    cache,
    client,
    coordination,
    kubeconfig,
    log,
    provider,
    rbac,
    toolkit,
    webhook,
    workqueue,
)

EXPORTED = [
    "APIError",
    "AdmissionRequest",
    "AlreadyExists",
    "Aware",
    "Backoff",
    "BadRequest",
    "Builder",
    "BuilderError",
    "ByObject",
    "Cache",
    "CacheOptions",
    "ChannelSource",
    "Check",
    "Client",
    "Cluster",
    "ClusterConfig",
    "ClusterNotFound",
    "ClusterOptions",
    "ClusterPhase",
    "ClusterSelection",
    "ClusterStatus",
    "Conflict",
    "Controller",
    "ConversionFailed",
    "Denied",
    "EVERY_CLUSTER",
    "EventHandler",
    "EventRecorder",
    "FleetClient",
    "Forbidden",
    "Gone",
    "HandlerDefaults",
    "Invalid",
    "Kind",
    "KindNotFound",
    "KindSource",
    "KubeconfigError",
    "KubeconfigSecretProvider",
    "LOCAL_CLUSTER",
    "LOCAL_ONLY",
    "LeaderElectionConfig",
    "MCRuntimeError",
    "Manager",
    "ManagerSettings",
    "MultiProvider",
    "NamespaceNotCached",
    "NamespacedCluster",
    "NotFound",
    "ObjectEvent",
    "PROVIDER_ONLY",
    "Permission",
    "Predicate",
    "Provider",
    "ReconcileFunction",
    "Reconciler",
    "Request",
    "ResourceEventHandler",
    "Result",
    "RetryPolicy",
    "RoutedClient",
    "Runnable",
    "ServerError",
    "ServerTimeout",
    "SettingsError",
    "ShardedCoordinator",
    "ShardingConfig",
    "SingleProvider",
    "StaticProvider",
    "TerminalError",
    "TooManyRequests",
    "TrustPolicy",
    "TrustPolicyError",
    "Unauthorized",
    "Unreachable",
    "WebhookOptions",
    "__version__",
    "all_of",
    "annotations_changed",
    "any_of",
    "configure_logging",
    "controller_managed_by",
    "current_request",
    "enqueue_for_object",
    "enqueue_for_owner",
    "enqueue_mapped",
    "generation_changed",
    "has_labels",
    "in_cluster_config",
    "in_clusters",
    "in_namespaces",
    "kubeconfig_from_dict",
    "kubeconfig_from_yaml",
    "labels_changed",
    "load_kubeconfig",
    "load_kubeconfig_env",
    "negate",
    "rbac_for",
    "resource_version_changed",
    "run_manager",
    "webhook_managed_by",
]


TOOLKIT = [
    "AlreadyOwnedByClusterError",
    "AlreadyOwnedError",
    "ChildCleanup",
    "CleanupResult",
    "ClusterOwner",
    "MutateFunction",
    "OWNER_ANNOTATION",
    "OWNER_KIND_LABEL",
    "OWNER_UID_LABEL",
    "Operation",
    "add_finalizer",
    "apply_merge_patch",
    "cluster_owner_of",
    "create_or_patch",
    "create_or_update",
    "enqueue_for_cluster_owner",
    "find_status_condition",
    "has_finalizer",
    "is_status_condition_true",
    "label_value",
    "merge_patch",
    "owned_by_kind_selector",
    "remove_finalizer",
    "remove_status_condition",
    "set_cluster_owner",
    "set_controller_reference",
    "set_owner_reference",
    "set_status_condition",
]


PROVIDER = [
    "Answer",
    "ClusterSet",
    "ClusterSetProvider",
    "HubProvider",
    "KindNotInstalled",
    "LastGood",
    "LastGoodConfigs",
    "ProviderRunnable",
    "SourceStatus",
    "follow_informers",
    "hub_connection",
    "resource_version",
    "secret_key_only",
    "secret_kubeconfig",
    "wait_for_kind",
]

TESTING = [
    "APIServer",
    "Assets",
    "AssetsError",
    "BACKEND_VARIABLE",
    "Backend",
    "Breakage",
    "CONTROLLERS",
    "Capability",
    "ControlPlane",
    "ETCD_VERSION",
    "EXIT_CODE_ANNOTATION",
    "EngagementRecorder",
    "Etcd",
    "Fleet",
    "KUBERNETES_VERSION",
    "KWOK_VERSION",
    "ManagedProcess",
    "Process",
    "ProcessBackend",
    "ProviderConformance",
    "ProviderDriver",
    "Target",
    "TestbedError",
    "User",
    "WorkloadAssets",
    "Workloads",
    "admin_config",
    "backend_named",
    "cache_dir",
    "ensure_assets",
    "ensure_workload_assets",
    "find_assets",
    "find_workload_assets",
    "live_processes",
    "running",
    "wait_until",
]

# The submodules that keep what left the root reachable (see the CHANGELOG).
SUBMODULES = {
    "cache": ["CacheSyncTimeout", "IndexFunc", "Informer", "field_getter", "strip_managed_fields"],
    "client": [
        "ClusterHealth",
        "FieldValidation",
        "FleetResult",
        "HealthState",
        "LabelSelector",
        "ObjectList",
        "PatchType",
        "Resource",
        "WatchEvent",
        "object_key",
    ],
    "coordination": ["Coordinator", "Fenced", "LeaderElector"],
    "kubeconfig": ["kubeconfig_paths_from_env", "list_contexts", "load_kubeconfig_async", "parse_kubeconfig"],
    "log": ["JSONFormatter", "ReconcileContext", "ReconcileContextFilter", "current_reconcile"],
    "rbac": ["DeclaresPermissions", "RBAC", "Subject", "render_rbac_yaml"],
    "webhook": [
        "ConversionFunction",
        "Defaulter",
        "OnError",
        "Validator",
        "WebhookBuilder",
        "WebhookServer",
        "Webhooks",
    ],
    "workqueue": [
        "ExponentialBackoff",
        "MaxOf",
        "QueueMetrics",
        "QueueShutDown",
        "RateLimiter",
        "TokenBucket",
        "WorkQueue",
        "default_rate_limiter",
    ],
}
SURFACES = {
    "mcruntime": mcruntime,
    "mcruntime.cache": cache,
    "mcruntime.client": client,
    "mcruntime.coordination": coordination,
    "mcruntime.kubeconfig": kubeconfig,
    "mcruntime.log": log,
    "mcruntime.provider": provider,
    "mcruntime.rbac": rbac,
    "mcruntime.toolkit": toolkit,
    "mcruntime.webhook": webhook,
    "mcruntime.workqueue": workqueue,
}


def test_the_root_stays_small() -> None:
    """The root is the runtime a program wires together; machinery lives in a submodule."""
    assert len(mcruntime.__all__) <= 100


def test_each_name_is_exported_once() -> None:
    """One import path per name: a name in two surfaces' ``__all__`` has two homes to keep in step."""
    homes: dict[str, list[str]] = {}
    for surface, module in SURFACES.items():
        for name in module.__all__:
            homes.setdefault(name, []).append(surface)
    assert {name: where for name, where in homes.items() if len(where) > 1} == {}


def test_the_provider_kit_exports_exactly_the_pinned_names() -> None:
    assert sorted(provider.__all__) == sorted(PROVIDER)
    for name in PROVIDER:
        assert getattr(provider, name) is not None


def test_the_testing_surface_exports_exactly_the_pinned_names() -> None:
    assert sorted(mcruntime.testing.__all__) == sorted(TESTING)
    for name in TESTING:
        assert getattr(mcruntime.testing, name) is not None


@pytest.mark.parametrize("submodule", sorted(SUBMODULES))
def test_each_submodule_exports_exactly_the_pinned_names(submodule: str) -> None:
    module = SURFACES[f"mcruntime.{submodule}"]
    assert sorted(module.__all__) == SUBMODULES[submodule]
    for name in SUBMODULES[submodule]:
        assert getattr(module, name) is not None


def test_the_exported_names_are_exactly_the_pinned_ones() -> None:
    assert sorted(mcruntime.__all__) == EXPORTED
    for name in EXPORTED:
        assert getattr(mcruntime, name) is not None


def _attribute_docstrings(module: str) -> dict[str, str]:
    """``NAME = ...`` followed by a string literal, in ``module``'s source."""
    source = Path(sys.modules[module].__file__ or "").read_text()
    found: dict[str, str] = {}
    body = ast.parse(source).body
    for statement, following in itertools.pairwise(body):
        target = None
        if isinstance(statement, ast.Assign) and len(statement.targets) == 1:
            target = statement.targets[0]
        elif isinstance(statement, ast.AnnAssign):
            target = statement.target
        if (
            isinstance(target, ast.Name)
            and isinstance(following, ast.Expr)
            and isinstance(following.value, ast.Constant)
            and isinstance(following.value.value, str)
        ):
            found[target.id] = following.value.value
    return found


def _defined_in(name: str) -> str | None:
    """The module whose source assigns ``name`` (aliases and constants have no ``__module__``)."""
    for module in sorted(m for m in sys.modules if m.startswith("mcruntime._")):
        if name in _attribute_docstrings(module):
            return module
    return None


def test_the_toolkit_exports_exactly_the_pinned_names() -> None:
    assert sorted(toolkit.__all__) == TOOLKIT
    for name in TOOLKIT:
        assert getattr(toolkit, name) is not None


@pytest.mark.parametrize(
    ("public", "names"), [(mcruntime, EXPORTED), (toolkit, TOOLKIT)], ids=["mcruntime", "toolkit"]
)
def test_every_exported_name_is_documented(public: object, names: list[str]) -> None:
    undocumented = []
    for name in names:
        if name == "__version__":
            continue
        value = getattr(public, name)
        if inspect.isclass(value) or inspect.isfunction(value) or inspect.ismethod(value):
            if not (inspect.getdoc(value) or "").strip():
                undocumented.append(name)
            continue
        module = _defined_in(name)
        if module is None or not _attribute_docstrings(module)[name].strip():
            undocumented.append(name)
    assert undocumented == []


def test_internals_stay_out_of_the_surface() -> None:
    internals = {
        "Store",
        "InformerStats",
        "HandlerRegistration",
        "ReconcileStats",
        "NoMetrics",
        "ManagerMetrics",
        "ShardMetrics",
        "Endpoints",
        "Checks",
        "WorkGate",
        "Seat",
        "Discovery",
        "rendezvous_owner",
        "json_copy",
        "to_json_shape",
    }
    assert internals.isdisjoint(mcruntime.__all__)
    assert all(not name.startswith("_") or name == "__version__" for name in mcruntime.__all__)
