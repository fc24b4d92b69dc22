"""mcruntime provider for kubeconfig files and directories.

Clusters from kubeconfig files, directories and KUBECONFIG lists, following edits
and Secret-volume rotations. The provider only discovers; engaging, replacing and
removing clusters is the core's ``ClusterSet``'s job, so the provider package stays
small and behaves like every other provider at the edges.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._naming import ContextSelection, Naming, NamingFunction, context_name, file_context_name
from ._provider import IndexFunction, KubeconfigFileProvider, PathInput
from ._scan import DEFAULT_INCLUDE, split_path_list
from ._status import CONTEXT, FILE, context_key

if TYPE_CHECKING:
    __version__: str
else:

    def __getattr__(name: str) -> str:
        if name == "__version__":  # importlib.metadata is ~25 ms of CPU at import: read when asked
            from importlib.metadata import version

            return version("mcruntime-provider-file")
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "CONTEXT",
    "DEFAULT_INCLUDE",
    "FILE",
    "ContextSelection",
    "IndexFunction",
    "KubeconfigFileProvider",
    "Naming",
    "NamingFunction",
    "PathInput",
    "__version__",
    "context_key",
    "context_name",
    "file_context_name",
    "split_path_list",
]
