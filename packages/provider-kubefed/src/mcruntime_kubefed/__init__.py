"""mcruntime provider for KubeFed cluster registrations.

Members registered with KubeFed (``KubeFedCluster`` objects and their token
Secrets in the KubeFed namespace of a host cluster) become clusters of an
mcruntime manager, added, updated and removed while it runs. The provider only
discovers; the core's ``ClusterSet`` engages, replaces and removes clusters, so
it behaves like every other provider at the edges.
"""

from __future__ import annotations

from importlib.metadata import version

from ._config import MemberConfigError, endpoint_url, member_config
from ._provider import (
    DEFAULT_NAMESPACE,
    KUBEFED_CLUSTER,
    MAX_TOKEN_BYTES,
    KubeFedNotInstalled,
    KubeFedProvider,
)

__version__ = version("mcruntime-provider-kubefed")

__all__ = [
    "DEFAULT_NAMESPACE",
    "KUBEFED_CLUSTER",
    "MAX_TOKEN_BYTES",
    "KubeFedNotInstalled",
    "KubeFedProvider",
    "MemberConfigError",
    "__version__",
    "endpoint_url",
    "member_config",
]
