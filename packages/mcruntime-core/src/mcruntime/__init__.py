"""mcruntime: Kubernetes controllers that reconcile across a dynamic fleet of clusters.

The public API is what this module exports; every implementation module is
private (``mcruntime._*``) so it can change without breaking users. Layers,
bottom to top: kubeconfig → transport/client → informer/cache → cluster.
``mcruntime.testing`` holds the testbed its tests and its users' tests run on.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._backoff import Backoff
from ._builder import Builder, BuilderError, controller_managed_by
from ._cache import Cache, CacheSyncTimeout, field_getter
from ._client import Client, ObjectList, PatchType, WatchEvent
from ._clients import FleetClient, FleetResult, RoutedClient
from ._cluster import Cluster, ClusterHealth, ClusterOptions
from ._clusterset import ClusterSet, ClusterState, ClusterStatus
from ._context import ReconcileContext, current_reconcile, current_request
from ._controller import Controller, ReconcileStats
from ._coordinator import Coordinator, Seat, WorkGate
from ._discovery import Discovery
from ._errors import (
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
from ._events import EventRecorder
from ._follow import follow_informers, hub_connection
from ._handler import EventHandler, enqueue_for_object, enqueue_for_owner, enqueue_mapped
from ._informer import (
    HandlerRegistration,
    IndexFunc,
    Informer,
    InformerStats,
    ResourceEventHandler,
    Store,
    strip_managed_fields,
)
from ._kind import Kind, Resource
from ._kubeconfig import (
    ClusterConfig,
    TrustPolicy,
    in_cluster_config,
    kubeconfig_from_dict,
    kubeconfig_paths_from_env,
    list_contexts,
    load_kubeconfig,
    load_kubeconfig_env,
)
from ._labels import LabelSelector
from ._leaderelection import LeaderElectionConfig, LeaderElector
from ._logging import JSONFormatter, ReconcileContextFilter, configure_logging
from ._manager import Manager, Runnable, run_manager
from ._metrics import ManagerMetrics
from ._objects import json_copy, object_key, to_json_shape
from ._predicate import (
    Event,
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
from ._provider import Aware, Provider, ProviderRunnable
from ._providers import MultiProvider, SingleProvider, StaticProvider
from ._ratelimit import ExponentialBackoff, MaxOf, RateLimiter, TokenBucket, default_rate_limiter
from ._reconcile import LOCAL_CLUSTER, ReconcileFunction, Reconciler, Request, Result, TerminalError
from ._rendezvous import owner as rendezvous_owner
from ._secret_provider import KubeconfigSecretProvider, SecretStatus
from ._serving import Check, Checks, Endpoints
from ._sharding import ShardedCoordinator, ShardingConfig, ShardMetrics
from ._source import EVERY_CLUSTER, LOCAL_ONLY, PROVIDER_ONLY, ChannelSource, ClusterSelection, KindSource
from ._transport import RetryPolicy
from ._workqueue import NoMetrics, QueueMetrics, QueueShutDown, WorkQueue

__version__ = "0.1.0"

__all__ = [
    "EVERY_CLUSTER",
    "LOCAL_CLUSTER",
    "LOCAL_ONLY",
    "PROVIDER_ONLY",
    "APIError",
    "AlreadyExists",
    "Aware",
    "BadRequest",
    "Builder",
    "BuilderError",
    "Cache",
    "CacheSyncTimeout",
    "ChannelSource",
    "Check",
    "Checks",
    "Client",
    "Cluster",
    "ClusterConfig",
    "ClusterHealth",
    "ClusterNotFound",
    "ClusterOptions",
    "ClusterSelection",
    "ClusterSet",
    "ClusterState",
    "ClusterStatus",
    "Conflict",
    "Controller",
    "Coordinator",
    "Discovery",
    "Endpoints",
    "Event",
    "EventHandler",
    "EventRecorder",
    "Backoff",
    "ExponentialBackoff",
    "FleetClient",
    "FleetResult",
    "Forbidden",
    "Gone",
    "HandlerRegistration",
    "IndexFunc",
    "Informer",
    "InformerStats",
    "Invalid",
    "JSONFormatter",
    "Kind",
    "KindNotFound",
    "KindSource",
    "KubeconfigError",
    "KubeconfigSecretProvider",
    "LabelSelector",
    "LeaderElectionConfig",
    "LeaderElector",
    "MCRuntimeError",
    "Manager",
    "ManagerMetrics",
    "ManagerSettings",
    "MaxOf",
    "MultiProvider",
    "NoMetrics",
    "NotFound",
    "ObjectList",
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
    "ReconcileStats",
    "Reconciler",
    "Request",
    "Resource",
    "ResourceEventHandler",
    "Result",
    "RetryPolicy",
    "RoutedClient",
    "Runnable",
    "Seat",
    "SecretStatus",
    "ServerError",
    "ServerTimeout",
    "SettingsError",
    "ShardMetrics",
    "ShardedCoordinator",
    "ShardingConfig",
    "SingleProvider",
    "StaticProvider",
    "Store",
    "TerminalError",
    "TokenBucket",
    "TooManyRequests",
    "TrustPolicy",
    "TrustPolicyError",
    "Unauthorized",
    "Unreachable",
    "WatchEvent",
    "WorkGate",
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
    "follow_informers",
    "generation_changed",
    "has_labels",
    "hub_connection",
    "in_cluster_config",
    "in_clusters",
    "in_namespaces",
    "json_copy",
    "kubeconfig_from_dict",
    "kubeconfig_paths_from_env",
    "labels_changed",
    "list_contexts",
    "load_kubeconfig",
    "load_kubeconfig_env",
    "negate",
    "object_key",
    "rendezvous_owner",
    "resource_version_changed",
    "run_manager",
    "strip_managed_fields",
    "to_json_shape",
]

if TYPE_CHECKING:
    from ._settings import ManagerSettings, SettingsError


def __getattr__(name: str) -> Any:
    # The settings pull in pydantic (~0.1 s of import time) and only programs
    # configured from the environment need them.
    if name in ("ManagerSettings", "SettingsError"):
        from . import _settings

        return getattr(_settings, name)
    raise AttributeError(f"module 'mcruntime' has no attribute {name!r}")
