"""mcruntime provider for SIG-Multicluster's cluster inventory (ClusterProfile, KEP-4322).

The ClusterProfiles on a hub become clusters of an mcruntime manager, named
``<namespace>/<name>``, once their control plane is healthy; they are let go
when a profile is deleted. Credentials come from the consumer's provider file
(the JSON the Go tooling reads): an exec credential plugin per access
provider, with the KEP-5339 policies for what a profile may add to it. The
provider only discovers; the core's ``ClusterSet`` engages, replaces and
removes clusters.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._access import (
    ADDITIONAL_ARGS_EXTENSION,
    ADDITIONAL_ENVS_EXTENSION,
    EXEC_EXTENSION,
    AccessConfig,
    AccessConfigError,
    AccessProvider,
    ArgsPolicy,
    EnvPolicy,
)
from ._profile import (
    CONTROL_PLANE_HEALTHY,
    MAX_ACCESS_PROVIDERS,
    MAX_PROFILE_BYTES,
    MAX_STRING_CHARS,
    ProfileError,
    Readiness,
    control_plane_healthy,
)
from ._provider import (
    CLUSTER_MANAGER_LABEL,
    CLUSTER_PROFILE,
    ClusterProfileNotInstalled,
    ClusterProfileProvider,
)

if TYPE_CHECKING:
    __version__: str
else:

    def __getattr__(name: str) -> str:
        if name == "__version__":  # importlib.metadata is ~25 ms of CPU at import: read when asked
            from importlib.metadata import version

            return version("mcruntime-provider-clusterprofile")
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "ADDITIONAL_ARGS_EXTENSION",
    "ADDITIONAL_ENVS_EXTENSION",
    "CLUSTER_MANAGER_LABEL",
    "CLUSTER_PROFILE",
    "CONTROL_PLANE_HEALTHY",
    "EXEC_EXTENSION",
    "MAX_ACCESS_PROVIDERS",
    "MAX_PROFILE_BYTES",
    "MAX_STRING_CHARS",
    "AccessConfig",
    "AccessConfigError",
    "AccessProvider",
    "ArgsPolicy",
    "ClusterProfileNotInstalled",
    "ClusterProfileProvider",
    "EnvPolicy",
    "ProfileError",
    "Readiness",
    "__version__",
    "control_plane_healthy",
]
