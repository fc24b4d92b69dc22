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

Everything found is input we do not control. A file is never read beyond
``max_bytes``, and what cannot be searched (an unreadable directory, a
symlink loop) is returned as a problem naming its path, never skipped quietly.
"""

from __future__ import annotations

import errno
import hashlib
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import mcruntime as mcr
from mcruntime.kubeconfig import list_contexts, parse_kubeconfig

from ._interest import Interest, name_matcher
from ._naming import current_context_only

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

MAX_FILE_BYTES = 1024 * 1024
"""Default size limit of a kubeconfig file: what a Kubernetes Secret (a mounted one, say) can hold."""

# Top-level keys every complete kubeconfig has (kubectl writes them even when empty). A file that
# parses but lacks one was most likely cut short by a writer still at work.
_REQUIRED_KEYS = ("clusters", "contexts", "users")


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
    problems: tuple[tuple[Path, str], ...] = ()
    """Paths that could not be searched or followed, each with a message naming it."""
    interest: Interest = field(default_factory=Interest)
    """Which changes in the watched directories can change what is read."""


def _nearest_existing(path: Path) -> Path:
    """``path`` or its closest existing ancestor: where a path that does not exist yet will appear."""
    candidate = path
    while not candidate.is_dir() and candidate.parent != candidate:
        candidate = candidate.parent
    return candidate


def find_files(
    inputs: Sequence[Path], include: Sequence[str], recursive: bool, reuse: dict[str, Found] | None = None
) -> Layout:
    """Resolve the inputs to kubeconfig files, in a deterministic order, and what to watch.

    An input that is a directory is searched (names matching ``include``;
    dot entries such as ``..data`` and ``..2024_01_01_...`` skipped); any other
    input is a file, watched for creation while it does not exist. Each file
    appears once, at its first position. A directory that cannot be listed and
    a symlink that loops are reported in ``problems``.

    ``reuse``, kept by the caller from pass to pass, holds what the last pass
    found in directories, by path; it is replaced with this pass's. A path
    seen before is not built again (nor hashed: a path keeps its hash). At
    10,000 files, building the paths was half of a pass that found nothing
    new; with them reused, the pass takes a third of the CPU it took.
    """
    files: dict[Path, Found] = {}
    watch: set[Path] = set()
    watch_recursive: set[Path] = set()
    problems: dict[Path, str] = {}
    directories: list[Path] = []
    previous: Mapping[str, Found] = reuse if reuse is not None else {}
    seen: dict[str, Found] = {}
    for path in inputs:
        if path.is_dir():
            directories.append(path)
            (watch_recursive if recursive else watch).add(path)
            watch.add(_nearest_existing(path.parent))  # notices the directory itself being replaced
            search = _Search(include, recursive, problems, previous, seen)
            for found in search.directory(path, (os.path.realpath(path),)):
                files.setdefault(found.path, found)
        else:
            watch.add(_nearest_existing(path.parent))
            files.setdefault(path, Found(path, explicit=True))
    if reuse is not None:
        reuse.clear()
        reuse.update(seen)
    return Layout(
        tuple(files.values()),
        frozenset(watch),
        frozenset(watch_recursive - watch),
        tuple(problems.items()),
        Interest.of(
            directories=directories,
            files=[found.path for found in files.values() if found.explicit],
            recursive=recursive,
            include=include,
        ),
    )


@dataclass
class _Search:
    """One directory input's search: the globs, and where problems are recorded."""

    include: Sequence[str]
    recursive: bool
    problems: dict[Path, str]
    previous: Mapping[str, Found]
    seen: dict[str, Found]
    visited: set[str] = field(default_factory=set)

    def directory(self, directory: Path, ancestors: tuple[str, ...]) -> list[Found]:
        """The matching files of ``directory`` (and below, when recursive), in name order."""
        try:
            with os.scandir(directory) as listing:
                entries = sorted(listing, key=lambda entry: entry.name)
        except FileNotFoundError:
            return []  # vanished since it was listed: the next pass looks again
        except OSError as error:
            self.problems[directory] = f"{directory}: cannot list the directory: {error.strerror}"
            return []
        found: list[Found] = []
        matches = name_matcher(tuple(self.include))
        for entry in entries:
            if entry.name.startswith("."):
                continue
            wanted = matches(entry.name)
            try:
                if entry.is_dir():
                    if self.recursive:
                        found.extend(self._below(directory / entry.name, ancestors))
                elif entry.is_file() and wanted:
                    known = self.previous.get(entry.path)
                    if known is None:
                        known = Found(directory / entry.name, explicit=False)
                    self.seen[entry.path] = known
                    found.append(known)
            except OSError as error:
                path = directory / entry.name
                if error.errno == errno.ELOOP and (wanted or self.recursive):
                    self.problems[path] = f"{path}: a symlink loop (too many levels of links); skipped"
                elif wanted:
                    self.problems[path] = f"{path}: cannot look at the entry: {error.strerror}"
        return found

    def _below(self, path: Path, ancestors: tuple[str, ...]) -> list[Found]:
        real = os.path.realpath(path)
        if real in ancestors:
            self.problems[path] = f"{path}: a symlink loop (leads back to {real}); not searched again"
            return []
        if real in self.visited:
            return []  # reached twice by two routes: searched once
        self.visited.add(real)
        return self.directory(path, (*ancestors, real))


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


def read_file(
    found: Found, select: ContextFilter, trust: mcr.TrustPolicy, *, max_bytes: int = MAX_FILE_BYTES
) -> Reading:
    """Read one kubeconfig file through its symlinks and build a config per selected context.

    A file larger than ``max_bytes`` is refused without being read (its size
    is checked before, and the read stops one byte past the limit in case it
    grew meanwhile). Relative file references resolve against the directory
    *as seen*, so they follow a Secret volume's ``..data`` swap instead of
    pinning an old target. Messages name the file and context and never
    quote the content.
    """
    path = found.path
    try:
        with path.open("rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            if size > max_bytes:
                return too_large(path, size, max_bytes)
            content = handle.read(max_bytes + 1)
    except FileNotFoundError:
        return Reading(path, exists=False)
    except IsADirectoryError:
        return Reading(path, exists=True, error=f"{path}: is a directory, not a kubeconfig file")
    except OSError as error:
        return Reading(path, exists=True, error=f"{path}: cannot read the file: {error.strerror}")
    if len(content) > max_bytes:
        return too_large(path, len(content), max_bytes)
    return parse_file(found, content, select, trust)


def too_large(path: Path, size: int, limit: int) -> Reading:
    """The reading of a file over the size limit: an error naming both, and nothing read."""
    return Reading(
        path,
        exists=True,
        error=f"{path}: the file is {size} bytes, more than the limit of {limit} bytes; not read",
    )


def parse_file(
    found: Found, content: bytes, select: ContextFilter, trust: mcr.TrustPolicy, digest: str | None = None
) -> Reading:
    """What ``content`` (the bytes of ``found``) says: a config per selected context, or why not."""
    path = found.path
    digest = digest or content_digest(content)

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
    if kind is None and not found.explicit and not any(key in data for key in _REQUIRED_KEYS):
        return Reading(path, exists=True, digest=digest, contexts=(), ignored=True)  # some other YAML
    incomplete = _incomplete(data)
    if incomplete is not None:
        return failed(f"an incomplete kubeconfig ({incomplete}); nothing is removed until it is whole")
    current = data.get("current-context")
    current = current if isinstance(current, str) and current else None
    if select is current_context_only and current is None:
        return failed("sets no current-context, and only the current context is selected")
    names = list(dict.fromkeys(list_contexts(data)))  # kubectl: the first entry of a name wins
    chosen = list(dict.fromkeys(select(names, current)))
    readings = tuple(_build(data, path, context, trust) for context in chosen)
    watch = frozenset(_referenced_directories(reading.config for reading in readings))
    return Reading(path, exists=True, digest=digest, contexts=readings, watch=watch)


def _incomplete(data: dict[str, Any]) -> str | None:
    """Why a parsed document looks cut short (a writer still at work), or None if it looks whole.

    Only a whole file may say that a context is gone: a half-written one that
    happens to be valid YAML must not disengage the contexts it does not reach.
    """
    missing = [key for key in _REQUIRED_KEYS if key not in data]
    if missing:
        return f"no {', '.join(repr(key) for key in missing)}"
    contexts = data.get("contexts")
    if contexts is not None and not isinstance(contexts, list):
        return "'contexts' is not a list"
    for index, item in enumerate(contexts or []):
        named = isinstance(item, dict) and isinstance(item.get("name"), str)
        if not named or not isinstance(item.get("context"), dict):
            return f"contexts[{index}] has no name or no context"
    return None


def _parse(content: bytes) -> tuple[dict[str, Any], str | None]:
    try:
        text = content.decode("utf-8")
    except UnicodeDecodeError:
        return {}, "not UTF-8 text"
    if not text.strip():
        return {}, "the file is empty"
    try:
        # The core's bounded parser: no aliases, bounded depth and values (the
        # provider has already refused files over its size limit, unread).
        data = parse_kubeconfig(text, origin="", max_bytes=len(content))
    except mcr.KubeconfigError as error:
        return {}, str(error)
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


def content_digest(content: bytes) -> str:
    """How file contents are compared (and shown in statuses): SHA-256, hex."""
    return hashlib.sha256(content).hexdigest()


def referenced_files(reading: Reading) -> set[Path]:
    """The certificate, key and token files the reading's configs name (absolute)."""
    files: set[Path] = set()
    for item in reading.contexts or ():
        if item.config is None:
            continue
        config = item.config
        for entry, fields in ((config.cluster, _CLUSTER_FILE_FIELDS), (config.user, _USER_FILE_FIELDS)):
            for name in fields:
                value = entry.get(name)
                if isinstance(value, str) and value:
                    files.add(Path(value))
    return files


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
