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
from mcruntime import toolkit

EXPORTED = [
    "APIError",
    "AlreadyExists",
    "Aware",
    "Backoff",
    "BadRequest",
    "Builder",
    "BuilderError",
    "ByObject",
    "Cache",
    "CacheOptions",
    "CacheSyncTimeout",
    "ChannelSource",
    "Check",
    "Client",
    "Cluster",
    "ClusterConfig",
    "ClusterHealth",
    "ClusterNotFound",
    "ClusterOptions",
    "ClusterPhase",
    "ClusterSelection",
    "ClusterStatus",
    "Conflict",
    "Controller",
    "Coordinator",
    "EVERY_CLUSTER",
    "EventHandler",
    "EventRecorder",
    "ExponentialBackoff",
    "FleetClient",
    "FleetResult",
    "Forbidden",
    "Gone",
    "HandlerDefaults",
    "HealthState",
    "IndexFunc",
    "Informer",
    "Invalid",
    "JSONFormatter",
    "Kind",
    "KindNotFound",
    "KindSource",
    "KubeconfigError",
    "KubeconfigSecretProvider",
    "LOCAL_CLUSTER",
    "LOCAL_ONLY",
    "LabelSelector",
    "LeaderElectionConfig",
    "LeaderElector",
    "MCRuntimeError",
    "Manager",
    "ManagerSettings",
    "MaxOf",
    "MultiProvider",
    "NamespaceNotCached",
    "NamespacedCluster",
    "NotFound",
    "ObjectEvent",
    "ObjectList",
    "PROVIDER_ONLY",
    "PatchType",
    "Predicate",
    "Provider",
    "ProviderRunnable",
    "QueueMetrics",
    "QueueShutDown",
    "RateLimiter",
    "ReconcileContext",
    "ReconcileContextFilter",
    "ReconcileFunction",
    "Reconciler",
    "Request",
    "Resource",
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
    "TokenBucket",
    "TooManyRequests",
    "TrustPolicy",
    "TrustPolicyError",
    "Unauthorized",
    "Unreachable",
    "WatchEvent",
    "WorkQueue",
    "__version__",
    "all_of",
    "annotations_changed",
    "any_of",
    "configure_logging",
    "controller_managed_by",
    "current_reconcile",
    "current_request",
    "default_rate_limiter",
    "enqueue_for_object",
    "enqueue_for_owner",
    "enqueue_mapped",
    "field_getter",
    "generation_changed",
    "has_labels",
    "in_cluster_config",
    "in_clusters",
    "in_namespaces",
    "kubeconfig_from_dict",
    "kubeconfig_from_yaml",
    "kubeconfig_paths_from_env",
    "labels_changed",
    "list_contexts",
    "load_kubeconfig",
    "load_kubeconfig_async",
    "load_kubeconfig_env",
    "negate",
    "object_key",
    "parse_kubeconfig",
    "resource_version_changed",
    "run_manager",
    "strip_managed_fields",
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
