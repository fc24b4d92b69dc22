"""What the provider made of each file and each context, in the core's one status shape.

A provider that keeps last good configs must say that it does, or a broken
file goes unnoticed until the cluster it describes moves. Every file and
every selected context is reported as a :class:`mcruntime.provider.SourceStatus`;
they name paths and contexts and say what is wrong, and never quote a file's
content.
"""

from __future__ import annotations

from mcruntime.provider import SourceStatus

FILE = "kubeconfig file"
"""The ``kind`` of a file's source (also of a path that could not be searched)."""
CONTEXT = "kubeconfig context"
"""The ``kind`` of a selected context's source."""


def file_source(
    path: str, *, digest: str | None, error: str | None, removing: tuple[str, ...] = ()
) -> SourceStatus:
    """One file: its content's digest, a file-level problem, and the contexts waiting to be removed."""
    detail = {"removing": ", ".join(removing)} if removing else {}
    return SourceStatus(FILE, path, version=digest, error=error, detail=detail)


def context_key(path: str, context: str) -> str:
    """The key of a context's source: its file's path and its name, ``"<path>#<context>"``."""
    return f"{path}#{context}"


def context_source(
    path: str,
    context: str,
    *,
    cluster: str | None,
    engaged: bool,
    error: str | None,
    stale: bool,
    duplicate_of: str | None,
) -> SourceStatus:
    """One selected context: the cluster it names, whether it is the one engaged, and why not."""
    detail = {"file": path, "context": context}
    if duplicate_of is not None:
        detail["duplicate_of"] = duplicate_of
    return SourceStatus(
        CONTEXT,
        context_key(path, context),
        cluster=cluster,
        engaged=engaged,
        error=error,
        stale=stale,
        detail=detail,
    )
