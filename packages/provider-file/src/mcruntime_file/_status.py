"""What the provider made of each file and each context, in the core's one status shape.

A provider that keeps last good configs must say that it does, or a broken
file goes unnoticed until the cluster it describes moves. Every file and
every selected context is reported as a :class:`mcruntime.provider.SourceStatus`;
they name paths and contexts and say what is wrong, and never quote a file's
content.

The paths and names they quote are not ours either: a file name, a context
name or a path field may hold a line break or a terminal escape. Every message
leaves here through :func:`printable`, so that none can forge a log line or
repaint the operator's terminal.
"""

from __future__ import annotations

from mcruntime.provider import SourceStatus

FILE = "kubeconfig file"
"""The ``kind`` of a file's source (also of a path that could not be searched)."""
CONTEXT = "kubeconfig context"
"""The ``kind`` of a selected context's source."""


def printable(text: str) -> str:
    r"""``text`` with every character ``repr`` would escape (line breaks, ESC, bidi controls) escaped.

    Messages quote file names, context names and path fields, which the
    provider does not control: ``"evil\nCRITICAL ..."`` would otherwise start
    a forged line in a text log. Printable text, every path in practice, is
    returned as is (a backslash included: it breaks no line), so messages
    keep quoting paths as they are written.
    """
    if text.isprintable():
        return text
    return "".join(char if char.isprintable() else repr(char)[1:-1] for char in text)


def file_source(
    path: str, *, digest: str | None, error: str | None, removing: tuple[str, ...] = ()
) -> SourceStatus:
    """One file: its content's digest, a file-level problem, and the contexts waiting to be removed."""
    detail = {"removing": ", ".join(removing)} if removing else {}
    return SourceStatus(FILE, path, version=digest, error=_shown(error), detail=detail)


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
        error=_shown(error),
        stale=stale,
        detail=detail,
    )


def _shown(error: str | None) -> str | None:
    return None if error is None else printable(error)
