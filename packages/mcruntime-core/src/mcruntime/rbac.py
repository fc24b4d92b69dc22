"""The RBAC machinery, for code that renders or inspects the permissions a program needs.

:func:`mcruntime.rbac_for` derives the RBAC of a manager and
:class:`mcruntime.Permission` is one rule; these name the rest: the derived
:class:`RBAC` and the :class:`Subject` it binds, :func:`render_rbac_yaml` to
write it as manifests, and :class:`DeclaresPermissions`, what a provider
implements (``rbac_rules()``) to say what it reads on its hub. Kept out of
``mcruntime``'s root so the root stays the runtime a program wires together.
"""

from __future__ import annotations

from ._fleet.protocols import DeclaresPermissions
from ._rbac.rbac import RBAC, Subject, render_rbac_yaml

__all__ = ["RBAC", "DeclaresPermissions", "Subject", "render_rbac_yaml"]
