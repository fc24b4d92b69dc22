"""The cache's machinery, for code that drives informers itself (providers watching a hub, tools).

A controller reads through ``cluster.cache`` and never needs these; a provider
that watches objects on a hub builds an :class:`Informer` of its own. Kept out
of ``mcruntime``'s root so the root stays the runtime a program wires together.
"""

from __future__ import annotations

from ._cache.cache import field_getter
from ._cache.informer import Informer, strip_managed_fields

__all__ = ["Informer", "field_getter", "strip_managed_fields"]
