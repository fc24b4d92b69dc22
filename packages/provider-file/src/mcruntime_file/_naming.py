"""How a context in a kubeconfig file becomes a cluster name, and which contexts count.

Names are the only identity a cluster has in a controller (requests, metrics,
logs), so they must be stable for as long as the file describes the cluster,
and the same for a second provider over the same files. The default,
``file/context``, joins the file's absolute path as the provider sees it
(symlinks not resolved, so a Secret-volume rotation keeps it) with the context
name: two distinct files can never produce the same name.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from pathlib import Path
from typing import Literal, TypeAlias

NamingFunction: TypeAlias = Callable[[Path, str], str | None]
"""``(kubeconfig path as seen, context) -> cluster name``, or ``None`` to skip the context."""

Naming: TypeAlias = Literal["file/context", "context"] | Mapping[str, str] | NamingFunction
"""A naming strategy: a built-in one by name, an explicit mapping, or a function."""

ContextSelection: TypeAlias = Literal["all", "current"] | Collection[str]
"""Which contexts of each file become clusters: every one, ``current-context`` only, or these."""


def file_context_name(path: Path, context: str) -> str:
    """The default name: ``<absolute path as seen>/<context>``; distinct files never collide."""
    return f"{path}/{context}"


def context_name(path: Path, context: str) -> str:
    """The context name alone: short, but two files may claim it (reported, first wins)."""
    del path
    return context


def naming_function(naming: Naming) -> NamingFunction:
    """Turn a strategy into one function, validating it once, at construction.

    An explicit mapping is keyed by context name or by the default
    ``file/context`` name (the more specific key wins); contexts it does not
    mention are not engaged, so a mapping is also a selection.
    """
    if naming == "file/context":
        return file_context_name
    if naming == "context":
        return context_name
    if isinstance(naming, str):
        raise ValueError(
            f"unknown naming strategy {naming!r}; use 'file/context', 'context', a mapping or a function"
        )
    if isinstance(naming, Mapping):
        mapping = dict(naming)
        for key, value in mapping.items():
            if not isinstance(key, str) or not isinstance(value, str) or not value:
                raise ValueError("a naming mapping maps context (or file/context) names to non-empty names")

        def mapped(path: Path, context: str) -> str | None:
            return mapping.get(file_context_name(path, context), mapping.get(context))

        return mapped
    if callable(naming):
        return naming
    raise TypeError(f"naming must be a strategy name, a mapping or a function, not {type(naming).__name__}")


def current_context_only(contexts: list[str], current: str | None) -> list[str]:
    """The ``"current"`` selection: the file's ``current-context``, or nothing when it sets none.

    A current-context naming no context is returned anyway, so that it is
    reported as that context's error; a file setting none is reported by the reader.
    """
    del contexts
    return [current] if current else []


def context_filter(selection: ContextSelection) -> Callable[[list[str], str | None], list[str]]:
    """Turn a selection into ``(contexts in file order, current-context) -> chosen contexts``."""
    if selection == "all":
        return lambda contexts, _current: list(contexts)
    if selection == "current":
        return current_context_only
    if isinstance(selection, str):
        raise ValueError(
            f"unknown context selection {selection!r}; use 'all', 'current' or a collection of context names"
        )
    wanted = frozenset(selection)
    return lambda contexts, _current: [context for context in contexts if context in wanted]
