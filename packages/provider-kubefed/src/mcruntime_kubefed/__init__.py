"""mcruntime provider for KubeFed cluster registrations.

Members registered with KubeFed (``KubeFedCluster`` objects and their token
Secrets in the KubeFed namespace of a host cluster) become clusters of an
mcruntime manager, added, updated and removed while it runs. The provider only
discovers; the core's ``ClusterSet`` engages, replaces and removes clusters, so
it behaves like every other provider at the edges.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._config import MemberConfigError, endpoint_url, member_config
from ._provider import (
    DEFAULT_NAMESPACE,
    KUBEFED_CLUSTER,
    MAX_TOKEN_BYTES,
    KubeFedNotInstalled,
    KubeFedProvider,
)

if TYPE_CHECKING:
    __version__: str
else:

    def __getattr__(name: str) -> str:
        if name == "__version__":  # importlib.metadata is ~25 ms of CPU at import: read when asked
            from importlib.metadata import version

            return version("mcruntime-provider-kubefed")
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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
