"""What the provider made of each file and each context, for operators and tests.

A provider that keeps last good configs must say that it does, or a broken
file goes unnoticed until the cluster it describes moves. Statuses name paths
and contexts and say what is wrong; they never quote a file's content.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class ContextStatus:
    """One selected context of one file.

    ``cluster`` is the name it claims (``None`` when the naming skips it);
    ``active`` says whether its config is the one engaged under that name.
    ``error`` says why its current version is not used (a broken entry, the
    trust policy, a duplicate name); ``stale`` means the cluster still runs on
    an earlier version of this context that worked.
    """

    context: str
    cluster: str | None
    active: bool
    error: str | None = None
    stale: bool = False
    duplicate_of: str | None = None


@dataclass(frozen=True)
class FileStatus:
    """One kubeconfig file, by its absolute path as the provider sees it.

    A path that could not be searched (a directory that cannot be listed, a
    symlink loop) has a status too: no digest, no contexts, and ``error``
    saying what is wrong with it.

    ``digest`` is the SHA-256 of the content last read (``None`` while the file
    is missing); ``error`` is a file-level problem (unreadable, not YAML,
    empty), in which case every context keeps its last good config.
    ``removing`` lists contexts that left the file and are disengaged once the
    file has stayed that way for the provider's ``removal_delay``.
    """

    path: str
    digest: str | None
    error: str | None = None
    contexts: dict[str, ContextStatus] = field(default_factory=dict)
    removing: tuple[str, ...] = ()

    def errors(self) -> list[str]:
        """Every problem of this file and its contexts, file-level first."""
        found = [self.error] if self.error else []
        found.extend(status.error for status in self.contexts.values() if status.error)
        return found
