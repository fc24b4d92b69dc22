"""mcruntime: Kubernetes controllers that reconcile across a dynamic fleet of clusters.

The public API is what this module exports (at most 100 names: the runtime a
program wires together), plus a few submodules for the machinery some code
needs: ``mcruntime.provider`` (the provider author's kit), ``mcruntime.toolkit``
(the controller helpers), ``mcruntime.cache``, ``mcruntime.client``,
``mcruntime.coordination``, ``mcruntime.kubeconfig``, ``mcruntime.log``,
``mcruntime.rbac``, ``mcruntime.webhook``, ``mcruntime.workqueue`` and
``mcruntime.testing`` (the testbed and the one test harness). Every
implementation module is private (``mcruntime._*``) and sits in a layer; the
layers, what each may import, and the check that keeps them so are described
in ``docs/guides/architecture.md`` and enforced by ``tests/test_layer_contract.py``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._base.backoff import Backoff
    from ._base.errors import (
        AlreadyExists,
        APIError,
        BadRequest,
        ClusterNotFound,
        Conflict,
        Forbidden,
        Gone,
        Invalid,
        KindNotFound,
        KubeconfigError,
        MCRuntimeError,
        NotFound,
        ServerError,
        ServerTimeout,
        TooManyRequests,
        TrustPolicyError,
        Unauthorized,
        Unreachable,
    )
    from ._base.kind import Kind
    from ._base.permissions import Permission
    from ._cache.cache import Cache
    from ._cache.informer import ResourceEventHandler
    from ._cache.options import ByObject, CacheOptions, NamespaceNotCached
    from ._client.client import Client
    from ._client.retry import RetryPolicy
    from ._config.kubeconfig import (
        ClusterConfig,
        TrustPolicy,
        in_cluster_config,
        kubeconfig_from_dict,
        kubeconfig_from_yaml,
        load_kubeconfig,
        load_kubeconfig_env,
    )
    from ._control.controller import Controller
    from ._control.events import EventRecorder
    from ._control.handler import (
        EventHandler,
        HandlerDefaults,
        enqueue_for_object,
        enqueue_for_owner,
        enqueue_mapped,
    )
    from ._control.predicate import (
        ObjectEvent,
        Predicate,
        all_of,
        annotations_changed,
        any_of,
        generation_changed,
        has_labels,
        in_clusters,
        in_namespaces,
        labels_changed,
        negate,
        resource_version_changed,
    )
    from ._control.source import (
        EVERY_CLUSTER,
        LOCAL_ONLY,
        PROVIDER_ONLY,
        ChannelSource,
        ClusterSelection,
        KindSource,
    )
    from ._coordination.leaderelection import LeaderElectionConfig
    from ._coordination.sharding import ShardedCoordinator, ShardingConfig
    from ._fleet.clients import FleetClient, RoutedClient
    from ._fleet.cluster import Cluster, ClusterOptions
    from ._fleet.namespaced import NamespacedCluster
    from ._fleet.protocols import Aware, Provider
    from ._fleet.secret_provider import KubeconfigSecretProvider
    from ._fleet.static_providers import MultiProvider, SingleProvider, StaticProvider
    from ._fleet.status import ClusterPhase, ClusterStatus
    from ._manager.builder import Builder, BuilderError, controller_managed_by
    from ._manager.logging import configure_logging
    from ._manager.manager import Manager, Runnable, run_manager
    from ._manager.serving import Check
    from ._manager.settings import ManagerSettings, SettingsError
    from ._manager.webhooks import webhook_managed_by
    from ._rbac.rbac import rbac_for
    from ._reconcile.context import current_request
    from ._reconcile.request import (
        LOCAL_CLUSTER,
        ReconcileFunction,
        Reconciler,
        Request,
        Result,
        TerminalError,
    )
    from ._webhook.handlers import ConversionFailed
    from ._webhook.options import WebhookOptions
    from ._webhook.review import AdmissionRequest, Denied

    __version__: str
    """The installed distribution's version: one source of truth, ``pyproject.toml``."""

# What each exported name is imported from, read when the name is first used
# (PEP 562): a process imports only the machinery it touches. The block above
# says the same to type checkers; tests/test_import_cost.py keeps the two equal.
_EXPORTED_FROM: dict[str, tuple[str, ...]] = {
    "_base.backoff": ("Backoff",),
    "_base.errors": (
        "AlreadyExists",
        "APIError",
        "BadRequest",
        "ClusterNotFound",
        "Conflict",
        "Forbidden",
        "Gone",
        "Invalid",
        "KindNotFound",
        "KubeconfigError",
        "MCRuntimeError",
        "NotFound",
        "ServerError",
        "ServerTimeout",
        "TooManyRequests",
        "TrustPolicyError",
        "Unauthorized",
        "Unreachable",
    ),
    "_base.kind": ("Kind",),
    "_base.permissions": ("Permission",),
    "_cache.cache": ("Cache",),
    "_cache.informer": ("ResourceEventHandler",),
    "_cache.options": ("ByObject", "CacheOptions", "NamespaceNotCached"),
    "_client.client": ("Client",),
    "_client.retry": ("RetryPolicy",),
    "_config.kubeconfig": (
        "ClusterConfig",
        "TrustPolicy",
        "in_cluster_config",
        "kubeconfig_from_dict",
        "kubeconfig_from_yaml",
        "load_kubeconfig",
        "load_kubeconfig_env",
    ),
    "_control.controller": ("Controller",),
    "_control.events": ("EventRecorder",),
    "_control.handler": (
        "EventHandler",
        "HandlerDefaults",
        "enqueue_for_object",
        "enqueue_for_owner",
        "enqueue_mapped",
    ),
    "_control.predicate": (
        "ObjectEvent",
        "Predicate",
        "all_of",
        "annotations_changed",
        "any_of",
        "generation_changed",
        "has_labels",
        "in_clusters",
        "in_namespaces",
        "labels_changed",
        "negate",
        "resource_version_changed",
    ),
    "_control.source": (
        "EVERY_CLUSTER",
        "LOCAL_ONLY",
        "PROVIDER_ONLY",
        "ChannelSource",
        "ClusterSelection",
        "KindSource",
    ),
    "_coordination.leaderelection": ("LeaderElectionConfig",),
    "_coordination.sharding": ("ShardedCoordinator", "ShardingConfig"),
    "_fleet.clients": ("FleetClient", "RoutedClient"),
    "_fleet.cluster": ("Cluster", "ClusterOptions"),
    "_fleet.namespaced": ("NamespacedCluster",),
    "_fleet.protocols": ("Aware", "Provider"),
    "_fleet.secret_provider": ("KubeconfigSecretProvider",),
    "_fleet.static_providers": ("MultiProvider", "SingleProvider", "StaticProvider"),
    "_fleet.status": ("ClusterPhase", "ClusterStatus"),
    "_manager.builder": ("Builder", "BuilderError", "controller_managed_by"),
    "_manager.logging": ("configure_logging",),
    "_manager.manager": ("Manager", "Runnable", "run_manager"),
    "_manager.serving": ("Check",),
    "_manager.webhooks": ("webhook_managed_by",),
    "_rbac.rbac": ("rbac_for",),
    "_reconcile.context": ("current_request",),
    "_reconcile.request": (
        "LOCAL_CLUSTER",
        "ReconcileFunction",
        "Reconciler",
        "Request",
        "Result",
        "TerminalError",
    ),
    "_webhook.handlers": ("ConversionFailed",),
    "_webhook.options": ("WebhookOptions",),
    "_webhook.review": ("AdmissionRequest", "Denied"),
    # pydantic (~0.1 s of import time): only programs configured from the environment need it
    "_manager.settings": ("ManagerSettings", "SettingsError"),
}
_MODULE_OF = {name: module for module, names in _EXPORTED_FROM.items() for name in names}

__all__ = [
    "EVERY_CLUSTER",
    "LOCAL_CLUSTER",
    "LOCAL_ONLY",
    "PROVIDER_ONLY",
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
    "LeaderElectionConfig",
    "MCRuntimeError",
    "Manager",
    "ManagerSettings",
    "MultiProvider",
    "NamespaceNotCached",
    "NamespacedCluster",
    "NotFound",
    "ObjectEvent",
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

if not TYPE_CHECKING:
    # Hidden from type checkers: a module-level __getattr__ would make every
    # ``mcruntime.<anything>`` type-check as Any, so a stale name would pass mypy.

    def __getattr__(name: str) -> Any:
        module = _MODULE_OF.get(name)
        if module is not None:
            value = getattr(importlib.import_module(f".{module}", __name__), name)
        elif name == "__version__":  # importlib.metadata costs ~25 ms of import time
            from importlib.metadata import version

            value = version("mcruntime-core")
        else:
            raise AttributeError(f"module 'mcruntime' has no attribute {name!r}")
        globals()[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted(set(globals()) | set(__all__))
