"""mcruntime provider for kubeconfig files and directories.

Clusters from kubeconfig files, directories and KUBECONFIG lists, following edits
and Secret-volume rotations. The provider only discovers; engaging, replacing and
removing clusters is the core's ``ClusterSet``'s job, so the provider package stays
small and behaves like every other provider at the edges.
"""

from __future__ import annotations

from importlib.metadata import version

__version__ = version("mcruntime-provider-file")

__all__ = ["__version__"]
