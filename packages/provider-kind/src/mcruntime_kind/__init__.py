"""mcruntime provider for local kind clusters.

:class:`KindProvider` engages one cluster per local kind cluster, under its kind
name, discovered by polling the kind CLI (``kind get clusters``, ``kind get
kubeconfig``). The provider only discovers; engaging, replacing and removing
clusters is the core's ``ClusterSet``'s job, so the package stays small and
behaves like every other provider at the edges. :class:`KindSettings` reads
the same options from ``MCRUNTIME_KIND_*`` environment variables.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._cli import NO_CLUSTERS, KindCLI, KindCommandError
from ._provider import LISTING, IndexFunc, KindProvider, context_name
from ._settings import ENV_PREFIX, KindSettings

if TYPE_CHECKING:
    __version__: str
else:

    def __getattr__(name: str) -> str:
        if name == "__version__":  # importlib.metadata is ~25 ms of CPU at import: read when asked
            from importlib.metadata import version

            return version("mcruntime-provider-kind")
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "ENV_PREFIX",
    "LISTING",
    "NO_CLUSTERS",
    "IndexFunc",
    "KindCLI",
    "KindCommandError",
    "KindProvider",
    "KindSettings",
    "__version__",
    "context_name",
]
