"""mcruntime provider for local kind clusters.

:class:`KindProvider` engages one cluster per local kind cluster, under its kind
name, discovered by polling the kind CLI (``kind get clusters``, ``kind get
kubeconfig``). The provider only discovers; engaging, replacing and removing
clusters is the core's ``ClusterSet``'s job, so the package stays small and
behaves like every other provider at the edges. :class:`KindSettings` reads
the same options from ``MCRUNTIME_KIND_*`` environment variables.
"""

from __future__ import annotations

from importlib.metadata import version

from ._cli import NO_CLUSTERS, KindCLI, KindCommandError
from ._provider import LISTING, IndexFunc, KindProvider, context_name
from ._settings import ENV_PREFIX, KindSettings

__version__ = version("mcruntime-provider-kind")

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
