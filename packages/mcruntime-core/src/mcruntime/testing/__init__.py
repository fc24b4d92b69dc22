"""Test real controllers against real control planes, without Docker.

``mcruntime.testing`` starts kube-apiserver + etcd on loopback the way
controller-runtime's envtest does, builds both from Go modules when no binaries
are around, and ships a pytest plugin (fixtures ``fleet``, ``fresh_cluster``,
``testbed``) so users test their controllers and providers exactly as mcruntime
tests itself. On request a cluster also runs kube-controller-manager,
kube-scheduler and kwok's simulated nodes (``Fleet(workloads=True)``), so Jobs
run and garbage is collected; and the components can run as containers
(``Fleet(backend="container")``) instead of child processes. The provider
conformance suite (:mod:`mcruntime.testing.conformance`) is re-exported here
too, imported on first use, so the testbed and its command line never import
pytest. One harness serves every package's tests: :func:`running` (a manager
for a block), :func:`admin_config` (a control plane's admin config) and
:func:`wait_until` (a deadline on a condition, the only way tests wait).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ._assets import (
    Assets,
    WorkloadAssets,
    cache_dir,
    ensure_assets,
    ensure_workload_assets,
    find_assets,
    find_workload_assets,
)
from ._backend import BACKEND_VARIABLE, Backend, Process, ProcessBackend, backend_named
from ._controlplane import APIServer, ControlPlane, User
from ._errors import AssetsError, TestbedError
from ._etcd import Etcd
from ._fleet import Fleet
from ._harness import EngagementRecorder
from ._process import ManagedProcess, live_processes
from ._running import admin_config, running, wait_until
from ._stages import EXIT_CODE_ANNOTATION
from ._versions import ETCD_VERSION, KUBERNETES_VERSION, KWOK_VERSION
from ._workloads import CONTROLLERS, Workloads

if TYPE_CHECKING:
    from .conformance import Breakage, Capability, ProviderConformance, ProviderDriver, Target

_CONFORMANCE = frozenset({"Breakage", "Capability", "ProviderConformance", "ProviderDriver", "Target"})


def __getattr__(name: str) -> Any:
    """Import the conformance suite when one of its names is first asked for."""
    if name in _CONFORMANCE:
        return getattr(importlib.import_module(".conformance", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "BACKEND_VARIABLE",
    "CONTROLLERS",
    "ETCD_VERSION",
    "EXIT_CODE_ANNOTATION",
    "KUBERNETES_VERSION",
    "KWOK_VERSION",
    "APIServer",
    "Assets",
    "AssetsError",
    "Backend",
    "Breakage",
    "Capability",
    "ControlPlane",
    "EngagementRecorder",
    "Etcd",
    "Fleet",
    "ManagedProcess",
    "Process",
    "ProcessBackend",
    "ProviderConformance",
    "ProviderDriver",
    "Target",
    "TestbedError",
    "User",
    "WorkloadAssets",
    "Workloads",
    "admin_config",
    "backend_named",
    "cache_dir",
    "ensure_assets",
    "ensure_workload_assets",
    "find_assets",
    "find_workload_assets",
    "live_processes",
    "running",
    "wait_until",
]
