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
``max_bytes``, nor opened in a way that can block (see :func:`read_regular`);
a kubeconfig name that is no regular file is refused by name, and what cannot
be searched (an unreadable directory, a symlink loop, a tree too deep) is
returned as a problem naming its path, never skipped quietly.
"""

from __future__ import annotations

import errno
import hashlib
import os
import stat
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import mcruntime as mcr
from mcruntime.kubeconfig import list_contexts, parse_kubeconfig

from ._contexts import ContextReading, build_contexts
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

MAX_DIRECTORY_DEPTH = 32
"""How many directory levels below a directory input a recursive search descends.

Real layouts nest a level or two (a Secret volume per cluster, say). The limit
keeps one pathological tree from costing every pass a walk of thousands of
levels; the directory where it stops is reported."""

QUOTED_CHARACTERS = 100
"""The most of a document's value (its ``kind``) a message quotes."""

# Never wait for a FIFO's writer, never take a terminal as the controlling one.
_OPEN_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
_READ_CHUNK = 1 << 16

_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)

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
    """One directory input's search: the globs, and where problems are recorded.

    Iterative, depth first in name order, at most :data:`MAX_DIRECTORY_DEPTH`
    levels down: a recursive walk hit Python's recursion limit in a tree a few
    hundred levels deep, and the ``RecursionError`` failed every pass, so no file
    anywhere was engaged and nothing named the cause.
    """

    include: Sequence[str]
    recursive: bool
    problems: dict[Path, str]
    previous: Mapping[str, Found]
    seen: dict[str, Found]
    visited: set[str] = field(default_factory=set)
    matches: Callable[[str], bool] = field(init=False)

    def __post_init__(self) -> None:
        self.matches = name_matcher(tuple(self.include))

    def directory(self, root: Path, ancestors: tuple[str, ...]) -> list[Found]:
        """The matching files of ``root`` (and below, when recursive), in name order, depth first."""
        found: list[Found] = []
        # One frame per directory being listed: its path, the real paths above it, its entries left.
        stack = [(root, ancestors, iter(self._list(root)))]
        while stack:
            directory, above, entries = stack[-1]
            entry = next(entries, None)
            if entry is None:
                stack.pop()
            elif self._entry(directory, entry, found):
                below = self._below(directory / entry.name, above, depth=len(stack), root=root)
                if below is not None:
                    path, real = below
                    stack.append((path, (*above, real), iter(self._list(path))))
        return found

    def _list(self, directory: Path) -> list[os.DirEntry[str]]:
        try:
            with os.scandir(directory) as listing:
                return sorted(listing, key=lambda entry: entry.name)
        except FileNotFoundError:
            return []  # vanished since it was listed: the next pass looks again
        except OSError as error:
            self.problems[directory] = f"{directory}: cannot list the directory: {error.strerror}"
            return []

    def _entry(self, directory: Path, entry: os.DirEntry[str], found: list[Found]) -> bool:
        """Take one entry: a kubeconfig name is found; returns whether it is a directory to search.

        A name matching ``include`` that is no regular file (a FIFO, a device,
        a directory when not recursive) is found all the same: the reader
        refuses it with a message naming what it is, and its contexts keep
        their last good config. Skipped, it would read as deleted, and its
        clusters would go without a word. A symlink leading nowhere is a file
        that is gone.
        """
        if entry.name.startswith("."):
            return False
        wanted = self.matches(entry.name)
        try:
            if entry.is_dir():
                if self.recursive:
                    return True
                if wanted:
                    found.append(self._found(directory, entry))
            elif wanted and (entry.is_file() or _exists(entry)):
                found.append(self._found(directory, entry))
        except OSError as error:
            path = directory / entry.name
            if error.errno == errno.ELOOP and (wanted or self.recursive):
                self.problems[path] = f"{path}: a symlink loop (too many levels of links); skipped"
            elif wanted:
                self.problems[path] = f"{path}: cannot look at the entry: {error.strerror}"
        return False

    def _found(self, directory: Path, entry: os.DirEntry[str]) -> Found:
        known = self.previous.get(entry.path)
        if known is None:
            known = Found(directory / entry.name, explicit=False)
        self.seen[entry.path] = known
        return known

    def _below(
        self, path: Path, ancestors: tuple[str, ...], depth: int, root: Path
    ) -> tuple[Path, str] | None:
        """The sub-directory ``path`` with its real path, if it is to be searched; else None."""
        real = os.path.realpath(path)
        if real in ancestors:
            self.problems[path] = f"{path}: a symlink loop (leads back to {real}); not searched again"
            return None
        if real in self.visited:
            return None  # reached twice by two routes: searched once
        if depth > MAX_DIRECTORY_DEPTH:
            self.problems[path] = (
                f"{path}: more than {MAX_DIRECTORY_DEPTH} directory levels below {root}; not searched"
            )
            return None
        self.visited.add(real)
        return path, real


def _exists(entry: os.DirEntry[str]) -> bool:
    """Whether an entry that is no regular file or directory is something (not a dangling symlink)."""
    try:
        entry.stat()
    except FileNotFoundError:
        return False
    return True


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
    content = read_regular(found.path, max_bytes)
    if isinstance(content, Reading):
        return content
    return parse_file(found, content, select, trust)


def special_kind(mode: int) -> str | None:
    """What a file is when it is no regular file ("a FIFO", "a directory", ...); None when it is one."""
    if stat.S_ISREG(mode):
        return None
    return next((what for test, what in _KINDS if test(mode)), "a special file")


def not_a_file(path: Path, kind: str) -> Reading:
    """The reading of a path that is no regular file: refused by what it is, never read."""
    return Reading(path, exists=True, error=f"{path}: is {kind}, not a kubeconfig file")


def cannot_read(path: Path, error: OSError) -> Reading:
    return Reading(path, exists=True, error=f"{path}: cannot read the file: {error.strerror or error}")


def read_regular(path: Path, max_bytes: int) -> bytes | Reading:
    """The content of ``path`` if it is a regular file within ``max_bytes``; else the reading saying why not.

    A plain ``open`` of a FIFO blocks until a writer comes: forever, in the
    worker thread the pass waits for, and the process could not even exit,
    since it waits for its worker threads. A terminal opened plainly becomes
    the process's controlling terminal, and a device such as ``/dev/zero``
    never ends. So the path is opened with ``O_NONBLOCK`` and ``O_NOCTTY``, and
    what was opened is judged by ``fstat`` of the descriptor, not by an earlier
    look at the name: what the name points at when it is opened is what counts.
    Nothing that is not a regular file is read, and nothing past the limit.
    """
    try:
        descriptor = os.open(path, _OPEN_FLAGS)
    except FileNotFoundError:
        return Reading(path, exists=False)
    except OSError as error:  # a socket (ENXIO), a permission, a name too long
        return cannot_read(path, error)
    try:
        result = os.fstat(descriptor)
        kind = special_kind(result.st_mode)
        if kind is not None:
            return not_a_file(path, kind)
        if result.st_size > max_bytes:
            return too_large(path, result.st_size, max_bytes)
        chunks: list[bytes] = []
        left = max_bytes + 1  # one byte past the limit: a file that grew since its fstat is seen to
        step = max(result.st_size + 1, _READ_CHUNK)
        while left > 0:
            chunk = os.read(descriptor, min(left, step))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
    except OSError as error:
        return cannot_read(path, error)
    finally:
        os.close(descriptor)
    content = b"".join(chunks)
    if len(content) > max_bytes:
        return too_large(path, len(content), max_bytes)
    return content


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
        return failed(f"not a kubeconfig (kind {quoted(kind)})")
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
    readings = build_contexts(data, path, chosen, trust)
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


def quoted(value: Any) -> str:
    """``repr(value)``, cut after :data:`QUOTED_CHARACTERS`: a document's value is not ours to print whole.

    A ``kind`` of 200,000 characters was quoted whole, into a status and a log line.
    """
    if isinstance(value, str) and len(value) > QUOTED_CHARACTERS:
        value = value[: QUOTED_CHARACTERS + 1]  # not repr of the whole: it is cut anyway
    text = repr(value)
    return text if len(text) <= QUOTED_CHARACTERS else f"{text[:QUOTED_CHARACTERS]}..."


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
