"""mcruntime: Kubernetes controllers that reconcile across a dynamic fleet of clusters.

The public API is what this module exports; every implementation module is
private (``mcruntime._*``) so it can change without breaking users. Layers,
bottom to top: kubeconfig → transport/client → informer/cache → cluster.
``mcruntime.testing`` holds the testbed its tests and its users' tests run on.
"""

from __future__ import annotations

from ._cache import Cache, CacheSyncTimeout, field_getter
from ._client import Client, ObjectList, PatchType, WatchEvent
from ._cluster import Cluster, ClusterHealth, ClusterOptions
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
from ._informer import (
    HandlerRegistration,
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
from ._objects import json_copy, object_key, to_json_shape
from ._ratelimit import ExponentialBackoff, MaxOf, RateLimiter, TokenBucket, default_rate_limiter
from ._transport import RetryPolicy
from ._workqueue import NoMetrics, QueueMetrics, QueueShutDown, WorkQueue

__version__ = "0.1.0"

__all__ = [
    "APIError",
    "AlreadyExists",
    "BadRequest",
    "Cache",
    "CacheSyncTimeout",
    "Client",
    "Cluster",
    "ClusterConfig",
    "ClusterHealth",
    "ClusterNotFound",
    "ClusterOptions",
    "Conflict",
    "Discovery",
    "ExponentialBackoff",
    "Forbidden",
    "Gone",
    "HandlerRegistration",
    "Informer",
    "InformerStats",
    "Invalid",
    "Kind",
    "KindNotFound",
    "KubeconfigError",
    "LabelSelector",
    "MCRuntimeError",
    "MaxOf",
    "NoMetrics",
    "NotFound",
    "ObjectList",
    "PatchType",
    "QueueMetrics",
    "QueueShutDown",
    "RateLimiter",
    "Resource",
    "ResourceEventHandler",
    "RetryPolicy",
    "ServerError",
    "ServerTimeout",
    "Store",
    "TokenBucket",
    "TooManyRequests",
    "TrustPolicy",
    "TrustPolicyError",
    "Unauthorized",
    "Unreachable",
    "WatchEvent",
    "WorkQueue",
    "__version__",
    "default_rate_limiter",
    "field_getter",
    "in_cluster_config",
    "json_copy",
    "kubeconfig_from_dict",
    "kubeconfig_paths_from_env",
    "list_contexts",
    "load_kubeconfig",
    "load_kubeconfig_env",
    "object_key",
    "strip_managed_fields",
    "to_json_shape",
]
