"""The controller toolkit: the steps most reconcilers take, done right once.

What controller-runtime's ``controllerutil`` and apimachinery's ``meta``
condition helpers give a Go controller, for JSON-shaped objects, plus what
a fleet needs and a single cluster does not: children in other clusters that
point back at their owner, and a finalizer that deletes them everywhere.

Single cluster: :func:`add_finalizer` / :func:`remove_finalizer` (patches
guarded by resourceVersion, conflicts retried), :func:`set_controller_reference`
and :func:`set_owner_reference`, :func:`create_or_update` and
:func:`create_or_patch`, :func:`merge_patch`, and the status-condition
functions. Across clusters: :func:`set_cluster_owner`,
:func:`enqueue_for_cluster_owner` and :class:`ChildCleanup`.

A module of its own rather than ``mcruntime.*``: these are plain functions
over objects that a reconciler calls, not parts of the runtime a program
wires together; importing them as ``from mcruntime import toolkit`` keeps
short names (``toolkit.set_status_condition``) unambiguous and keeps the
top-level surface the runtime's.
"""

from __future__ import annotations

from ._control.cleanup import ChildCleanup, CleanupResult
from ._control.ownership import (
    OWNER_ANNOTATION,
    OWNER_KIND_LABEL,
    OWNER_UID_LABEL,
    AlreadyOwnedByClusterError,
    ClusterOwner,
    cluster_owner_of,
    enqueue_for_cluster_owner,
    label_value,
    owned_by_kind_selector,
    set_cluster_owner,
)
from ._controllerutil.conditions import (
    find_status_condition,
    is_status_condition_true,
    remove_status_condition,
    set_status_condition,
)
from ._controllerutil.finalizers import add_finalizer, has_finalizer, remove_finalizer
from ._controllerutil.mutate import MutateFunction, Operation, create_or_patch, create_or_update
from ._controllerutil.owners import AlreadyOwnedError, set_controller_reference, set_owner_reference
from ._controllerutil.patch import apply_merge_patch, merge_patch

__all__ = [
    "OWNER_ANNOTATION",
    "OWNER_KIND_LABEL",
    "OWNER_UID_LABEL",
    "AlreadyOwnedByClusterError",
    "AlreadyOwnedError",
    "ChildCleanup",
    "CleanupResult",
    "ClusterOwner",
    "MutateFunction",
    "Operation",
    "add_finalizer",
    "apply_merge_patch",
    "cluster_owner_of",
    "create_or_patch",
    "create_or_update",
    "enqueue_for_cluster_owner",
    "find_status_condition",
    "has_finalizer",
    "is_status_condition_true",
    "label_value",
    "merge_patch",
    "owned_by_kind_selector",
    "remove_finalizer",
    "remove_status_condition",
    "set_cluster_owner",
    "set_controller_reference",
    "set_owner_reference",
    "set_status_condition",
]
