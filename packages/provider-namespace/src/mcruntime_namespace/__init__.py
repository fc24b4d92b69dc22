"""mcruntime provider: each namespace of one cluster as a cluster of its own.

For tenants that each own a namespace of one API server, and for testing fleet
logic on one API server: every selected namespace is engaged as a cluster named
after it, whose client and cache are pinned to it, so a reconciler written for
whole clusters runs per tenant unchanged. All of them share one connection and
one informer per kind (see :class:`mcruntime.NamespacedCluster`).
"""

from __future__ import annotations

from importlib.metadata import version

from ._provider import NAMESPACE, NamespaceProvider

__version__ = version("mcruntime-provider-namespace")

__all__ = ["NAMESPACE", "NamespaceProvider", "__version__"]
