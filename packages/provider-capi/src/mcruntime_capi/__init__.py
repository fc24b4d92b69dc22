"""mcruntime provider for Cluster API.

The workload clusters of a Cluster API management cluster (``Cluster`` objects
and their ``<name>-kubeconfig`` Secrets) become clusters of an mcruntime
manager as soon as their control plane is up, follow kubeconfig rotations, and
are let go when the Cluster is deleted. The provider only discovers; the core's
``ClusterSet`` engages, replaces and removes clusters.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._provider import (
    CLUSTER_NAME_LABEL,
    MAX_KUBECONFIG_BYTES,
    ClusterAPINotInstalled,
    ClusterAPIProvider,
    Readiness,
    control_plane_initialized,
)

if TYPE_CHECKING:
    __version__: str
else:

    def __getattr__(name: str) -> str:
        if name == "__version__":  # importlib.metadata is ~25 ms of CPU at import: read when asked
            from importlib.metadata import version

            return version("mcruntime-provider-capi")
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "CLUSTER_NAME_LABEL",
    "MAX_KUBECONFIG_BYTES",
    "ClusterAPINotInstalled",
    "ClusterAPIProvider",
    "Readiness",
    "__version__",
    "control_plane_initialized",
]
