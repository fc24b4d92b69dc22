"""Test real controllers against real control planes, without Docker.

``mcruntime.testing`` starts kube-apiserver + etcd on loopback the way
controller-runtime's envtest does, builds both from Go modules when no binaries
are around, and ships a pytest plugin (fixtures ``fleet``, ``fresh_cluster``,
``testbed``) so users test their controllers and providers exactly as mcruntime
tests itself. The provider conformance suite (:mod:`mcruntime.testing.conformance`)
is re-exported here too, imported on first use, so the testbed and its command
line never import pytest.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ._assets import Assets, cache_dir, ensure_assets, find_assets
from ._controlplane import APIServer, ControlPlane, User
from ._errors import AssetsError, TestbedError
from ._etcd import Etcd
from ._fleet import Fleet
from ._harness import EngagementRecorder
from ._process import ManagedProcess, live_processes
from ._versions import ETCD_VERSION, KUBERNETES_VERSION

if TYPE_CHECKING:
    from .conformance import Breakage, Capability, ProviderConformance, ProviderDriver, Target, wait_until

_CONFORMANCE = frozenset(
    {"Breakage", "Capability", "ProviderConformance", "ProviderDriver", "Target", "wait_until"}
)


def __getattr__(name: str) -> Any:
    """Import the conformance suite when one of its names is first asked for."""
    if name in _CONFORMANCE:
        return getattr(importlib.import_module(".conformance", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "ETCD_VERSION",
    "KUBERNETES_VERSION",
    "APIServer",
    "Assets",
    "AssetsError",
    "Breakage",
    "Capability",
    "ControlPlane",
    "EngagementRecorder",
    "Etcd",
    "Fleet",
    "ManagedProcess",
    "ProviderConformance",
    "ProviderDriver",
    "Target",
    "TestbedError",
    "User",
    "cache_dir",
    "ensure_assets",
    "find_assets",
    "live_processes",
    "wait_until",
]
