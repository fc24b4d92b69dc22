"""Test real controllers against real control planes, without Docker.

``mcruntime.testing`` starts kube-apiserver + etcd on loopback the way
controller-runtime's envtest does, builds both from Go modules when no binaries
are around, and ships a pytest plugin (fixtures ``fleet``, ``fresh_cluster``,
``testbed``) so users test their controllers and providers exactly as mcruntime
tests itself.
"""

from __future__ import annotations

from ._assets import Assets, cache_dir, ensure_assets, find_assets
from ._controlplane import APIServer, ControlPlane, User
from ._errors import AssetsError, TestbedError
from ._etcd import Etcd
from ._fleet import Fleet
from ._process import ManagedProcess, live_processes
from ._versions import ETCD_VERSION, KUBERNETES_VERSION

__all__ = [
    "ETCD_VERSION",
    "KUBERNETES_VERSION",
    "APIServer",
    "Assets",
    "AssetsError",
    "ControlPlane",
    "Etcd",
    "Fleet",
    "ManagedProcess",
    "TestbedError",
    "User",
    "cache_dir",
    "ensure_assets",
    "find_assets",
    "live_processes",
]
