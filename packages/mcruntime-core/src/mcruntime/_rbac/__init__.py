"""RBAC derived from the running program: what its controllers, providers and leases need.

The top layer: it reads a built (not started) :class:`~mcruntime.Manager` and
writes ClusterRoles, Roles and bindings, per role (hub and member).
"""
