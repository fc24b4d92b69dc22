"""Finding kubeconfig files and reading them, off the event loop.

Everything here is blocking file-system work, run in a worker thread by the
provider, and pure: it looks at the disk and returns what it saw, so the
provider alone decides what that means for the engaged clusters.

Two rules from the field shape it. Paths are kept *as seen* (absolute, with
symlinks unresolved): a Kubernetes Secret volume swaps a hidden ``..data``
symlink on every update, so a resolved path would point into a directory the
kubelet is about to delete. And content is *read through* the symlinks and
compared by hash, because the visible entries of such a volume keep their
own mtime and inode across updates.
"""

from __future__ import annotations

import fnmatch
import hashlib
import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

import mcruntime as mcr

DEFAULT_INCLUDE: tuple[str, ...] = (
    "config",
    "kubeconfig",
    "value",
    "*.kubeconfig",
    "*.kubeconfig.yaml",
    "*.kubeconfig.yml",
    "*.yaml",
    "*.yml",
)
"""File names a directory is searched for: kubectl's, Secret keys (``value`` is Cluster API's), YAML."""

# Fields of a built config that name files; the transport reads them, so their directories are watched.
_CLUSTER_FILE_FIELDS = ("certificate-authority",)
_USER_FILE_FIELDS = ("client-certificate", "client-key", "tokenFile")

ContextFilter = Callable[[list[str], str | None], list[str]]


def absolute(path: str | os.PathLike[str]) -> Path:
    """An absolute path with ``~`` expanded and symlinks left alone."""
    return Path(os.path.abspath(Path(path).expanduser()))


def split_path_list(value: str) -> list[Path]:
    """A ``KUBECONFIG``-style list (``os.pathsep``-separated; empty entries skipped) as paths."""
    return [absolute(part) for part in value.split(os.pathsep) if part]


@dataclass(frozen=True)
class Found:
    """A kubeconfig file to read, and whether it was named explicitly or found in a directory."""

    path: Path
    explicit: bool


@dataclass(frozen=True)
class Layout:
    """What the inputs amount to right now: files to read and directories to watch."""

    files: tuple[Found, ...]
    watch: frozenset[Path]
    """Directories watched for their direct entries (parents of files, searched directories)."""
    watch_recursive: frozenset[Path]
    """Directories searched recursively, watched with everything below them."""


def _nearest_existing(path: Path) -> Path:
    """``path`` or its closest existing ancestor: where a path that does not exist yet will appear."""
    candidate = path
    while not candidate.is_dir() and candidate.parent != candidate:
        candidate = candidate.parent
    return candidate


def find_files(inputs: Sequence[Path], include: Sequence[str], recursive: bool) -> Layout:
    """Resolve the inputs to kubeconfig files, in a deterministic order, and what to watch.

    An input that is a directory is searched (names matching ``include``;
    dot entries such as ``..data`` and ``..2024_01_01_...`` skipped); any other
    input is a file, watched for creation while it does not exist. Each file
    appears once, at its first position.
    """
    files: dict[Path, Found] = {}
    watch: set[Path] = set()
    watch_recursive: set[Path] = set()
    for path in inputs:
        if path.is_dir():
            (watch_recursive if recursive else watch).add(path)
            watch.add(_nearest_existing(path.parent))  # notices the directory itself being replaced
            for found in _search(path, include, recursive, {os.path.realpath(path)}):
                files.setdefault(found, Found(found, explicit=False))
        else:
            watch.add(_nearest_existing(path.parent))
            files.setdefault(path, Found(path, explicit=True))
    return Layout(tuple(files.values()), frozenset(watch), frozenset(watch_recursive - watch))


def _search(directory: Path, include: Sequence[str], recursive: bool, visited: set[str]) -> list[Path]:
    try:
        with os.scandir(directory) as listing:
            entries = sorted(listing, key=lambda entry: entry.name)
    except OSError:
        return []  # vanished or unreadable since it was listed: the next pass looks again
    found: list[Path] = []
    for entry in entries:
        if entry.name.startswith("."):
            continue
        path = directory / entry.name
        try:
            if entry.is_dir():
                real = os.path.realpath(path)
                if recursive and real not in visited:  # symlink loops end here
                    visited.add(real)
                    found.extend(_search(path, include, recursive, visited))
            elif entry.is_file() and any(fnmatch.fnmatchcase(entry.name, glob) for glob in include):
                found.append(path)
        except OSError:
            continue
    return found


@dataclass(frozen=True)
class ContextReading:
    """One selected context: its config, or why it cannot be used."""

    context: str
    config: mcr.ClusterConfig | None
    error: str | None


@dataclass(frozen=True)
class Reading:
    """One file as read now.

    ``exists`` false means the file is gone (authoritative). ``contexts`` is
    ``None`` when the file as a whole could not be used (``error`` says why):
    every context then keeps what it had. ``ignored`` marks a YAML file found in
    a directory that is not a kubeconfig at all.
    """

    path: Path
    exists: bool
    digest: str | None = None
    error: str | None = None
    contexts: tuple[ContextReading, ...] | None = None
    ignored: bool = False
    watch: frozenset[Path] = field(default_factory=frozenset)


def read_file(found: Found, select: ContextFilter, trust: mcr.TrustPolicy) -> Reading:
    """Read one kubeconfig file through its symlinks and build a config per selected context.

    Relative file references resolve against the directory *as seen*, so they
    follow a Secret volume's ``..data`` swap instead of pinning an old target.
    Messages name the file and context and never quote the content.
    """
    path = found.path
    try:
        content = path.read_bytes()
    except FileNotFoundError:
        return Reading(path, exists=False)
    except IsADirectoryError:
        return Reading(path, exists=True, error=f"{path}: is a directory, not a kubeconfig file")
    except OSError as error:
        return Reading(path, exists=True, error=f"{path}: cannot read the file: {error.strerror}")
    digest = hashlib.sha256(content).hexdigest()

    def failed(message: str) -> Reading:
        return Reading(path, exists=True, digest=digest, error=f"{path}: {message}")

    data, problem = _parse(content)
    if problem is not None:
        return failed(problem)
    kind = data.get("kind")
    if kind is not None and kind != "Config":
        if not found.explicit:
            return Reading(path, exists=True, digest=digest, contexts=(), ignored=True)
        return failed(f"not a kubeconfig (kind {kind!r})")
    current = data.get("current-context")
    names = list(dict.fromkeys(mcr.list_contexts(data)))  # kubectl: the first entry of a name wins
    chosen = list(dict.fromkeys(select(names, current if isinstance(current, str) else None)))
    readings = tuple(_build(data, path, context, trust) for context in chosen)
    watch = frozenset(_referenced_directories(reading.config for reading in readings))
    return Reading(path, exists=True, digest=digest, contexts=readings, watch=watch)


def _parse(content: bytes) -> tuple[dict[str, Any], str | None]:
    try:
        text = content.decode("utf-8")
    except UnicodeDecodeError:
        return {}, "not UTF-8 text"
    if not text.strip():
        return {}, "the file is empty"
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        return {}, f"not valid YAML{f' at line {mark.line + 1}' if mark is not None else ''}"
    if data is None:
        return {}, "the file is empty"
    if not isinstance(data, dict):
        return {}, "not a kubeconfig: the top level is not a mapping"
    return data, None


def _build(data: dict[str, Any], path: Path, context: str, trust: mcr.TrustPolicy) -> ContextReading:
    try:
        config = mcr.kubeconfig_from_dict(data, context, base_dir=path.parent, trust=trust, origin=str(path))
    except mcr.KubeconfigError as error:  # includes TrustPolicyError; messages are secret-free
        return ContextReading(context, None, str(error))
    except Exception as error:  # a shape no check foresaw: name the type, quote nothing
        return ContextReading(
            context, None, f"{path}, context {context!r}: not a usable kubeconfig ({type(error).__name__})"
        )
    return ContextReading(context, config, None)


def _referenced_directories(configs: Iterable[mcr.ClusterConfig | None]) -> set[Path]:
    directories: set[Path] = set()
    for config in configs:
        if config is None:
            continue
        for entry, fields in ((config.cluster, _CLUSTER_FILE_FIELDS), (config.user, _USER_FILE_FIELDS)):
            for name in fields:
                value = entry.get(name)
                if isinstance(value, str) and value:
                    directories.add(_nearest_existing(Path(value).parent))
    return directories
