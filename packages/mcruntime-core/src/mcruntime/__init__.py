"""mcruntime: Kubernetes controllers that reconcile across a dynamic fleet of clusters.

The runtime (providers, clusters, caches, controllers, the manager) grows here
layer by layer; ``mcruntime.testing`` holds the testbed its tests and its users'
tests run on.
"""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__"]
