"""mcruntime provider for KubeFed cluster registrations.

Clusters from KubeFed `KubeFedCluster` registrations on a host cluster. The provider
only discovers; engaging, replacing and removing clusters is the core's
``ClusterSet``'s job, so the provider package stays small and behaves like every
other provider at the edges.
"""

from __future__ import annotations

from importlib.metadata import version

__version__ = version("mcruntime-provider-kubefed")

__all__ = ["__version__"]
