"""mcruntime provider: each namespace of one cluster as a cluster of its own.

For tenants that each own a namespace of one API server, and for testing fleet
logic on one API server: every selected namespace is engaged as a cluster named
after it, whose client and cache are pinned to it, so a reconciler written for
whole clusters runs per tenant unchanged. All of them share one connection and
one informer per kind (see :class:`mcruntime.NamespacedCluster`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._provider import NAMESPACE, NamespaceProvider

if TYPE_CHECKING:
    __version__: str
else:

    def __getattr__(name: str) -> str:
        if name == "__version__":  # importlib.metadata is ~25 ms of CPU at import: read when asked
            from importlib.metadata import version

            return version("mcruntime-provider-namespace")
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["NAMESPACE", "NamespaceProvider", "__version__"]
