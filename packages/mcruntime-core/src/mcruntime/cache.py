"""The cache's machinery, for code that drives informers itself (providers watching a hub, tools).

A controller reads through ``cluster.cache`` and never needs these; a provider
that watches objects on a hub builds an :class:`Informer` of its own. :data:`IndexFunc` is the shape of an
index function, and :class:`CacheSyncTimeout` what a cache that did not sync in
time raises. Kept out
of ``mcruntime``'s root so the root stays the runtime a program wires together.
"""

from __future__ import annotations

from ._cache.cache import CacheSyncTimeout, field_getter
from ._cache.informer import IndexFunc, Informer, strip_managed_fields

__all__ = ["CacheSyncTimeout", "IndexFunc", "Informer", "field_getter", "strip_managed_fields"]
