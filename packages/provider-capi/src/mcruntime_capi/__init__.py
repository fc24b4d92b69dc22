"""mcruntime provider for Cluster API.

Clusters from Cluster API `Cluster` objects on a management cluster. The provider
only discovers; engaging, replacing and removing clusters is the core's
``ClusterSet``'s job, so the provider package stays small and behaves like every
other provider at the edges.
"""

from __future__ import annotations

from importlib.metadata import version

__version__ = version("mcruntime-provider-capi")

__all__ = ["__version__"]
