"""KubeconfigFileProvider: one cluster per selected context of kubeconfig files.

Discovery only: each pass finds the files, reads them through their symlinks,
decides which contexts are clusters under which names, and hands the whole
answer to a :class:`mcruntime.provider.ClusterSet`, which engages, replaces (or swaps a
rotated credential in place) and removes by content fingerprint. A pass runs on
any change in a watched directory (after a short debounce), when a pending
removal is due, and every ``rescan_interval`` seconds as a safety net.

What counts as "gone" is narrow on purpose: a file that no longer exists, or a
context no longer listed in a file that parses, and only after that state has
held for ``removal_delay`` seconds (a writer that truncates before it writes
must not cost a cluster its caches). Everything else (unreadable, not YAML,
empty, cut short, too large, a broken entry, refused by the trust policy)
keeps the last good config and is reported in
:meth:`KubeconfigFileProvider.sources`, as is every path that could not
be searched (an unreadable directory, a symlink loop).

A pass reads only the files whose stamp moved (see ``_reader``) and never a
file over ``max_file_bytes``, so a large or hostile file in a watched
directory costs one ``stat`` per pass.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import mcruntime as mcr
import mcruntime.provider as mcrp
from mcruntime.kubeconfig import kubeconfig_paths_from_env
from mcruntime.provider import ClusterSetProvider

from ._naming import ContextSelection, Naming, context_filter, naming_function
from ._reader import FileReader
from ._scan import (
    DEFAULT_INCLUDE,
    MAX_FILE_BYTES,
    Found,
    Layout,
    Reading,
    absolute,
    find_files,
    split_path_list,
)
from ._status import context_source, file_source, printable
from ._watch import DirectoryWatcher

log = logging.getLogger("mcruntime.providers.file")

IndexFunction = Callable[[dict[str, Any]], Iterable[str]]
"""A field index function, as :meth:`mcruntime.Provider.index_field` takes it."""

PathInput = str | os.PathLike[str] | Iterable[str | os.PathLike[str]]
"""A ``KUBECONFIG``-style list as one string, one path, or several paths."""


@dataclass
class _Context:
    """One selected context of one file: its last good config and its current problem."""

    config: mcr.ClusterConfig | None = None
    error: str | None = None


@dataclass
class _File:
    """What the provider knows of one file across passes."""

    found: Found
    order: int
    digest: str | None = None
    error: str | None = None
    ignored: bool = False
    contexts: dict[str, _Context] = field(default_factory=dict)
    leaving: dict[str, float] = field(default_factory=dict)  # context -> since when it is unlisted
    missing_since: float | None = None


def _inputs(paths: PathInput | None) -> tuple[Path, ...]:
    if paths is None:
        return tuple(absolute(path) for path in kubeconfig_paths_from_env())
    if isinstance(paths, str):
        listed = split_path_list(paths)
        if not listed:
            raise ValueError("no path given: the path list is empty")
        return tuple(listed)
    if isinstance(paths, os.PathLike):
        return (absolute(paths),)
    listed = [absolute(path) for path in paths]
    if not listed:
        raise ValueError("no path given: pass files, directories, or None for KUBECONFIG / ~/.kube/config")
    return tuple(listed)


class KubeconfigFileProvider(ClusterSetProvider):
    """Engages one cluster per selected context of kubeconfig files, following every edit.

    Args:
        paths: Files and directories to read. A string is a ``KUBECONFIG``-style
            list (split on ``os.pathsep``); a path or an iterable of paths is
            taken as is. ``None`` (the default) means ``KUBECONFIG``, else
            ``~/.kube/config``, read when the provider is built. A directory is
            searched for names matching ``include``; anything else is a file.
            Paths that do not exist yet are watched for creation.
        include: Glob patterns of file names searched for in directories. Dot
            entries (a Secret volume's ``..data``) are always skipped.
        recursive: Also search the sub-directories of directories.
        contexts: ``"all"`` (default), ``"current"`` (each file's
            ``current-context``), or a collection of context names.
        naming: ``"file/context"`` (default: ``<absolute path>/<context>``,
            never colliding), ``"context"``, a mapping from context names (or
            ``file/context`` names) to cluster names, which also selects, or a
            function ``(path, context) -> name | None``. Two contexts claiming
            one name are reported; the one that has it keeps it, else the first
            in input order (file order, then context order).
        trust: What a kubeconfig may ask for; :meth:`mcruntime.TrustPolicy.untrusted`
            by default (no exec plugins, auth-providers or disabled TLS checks).
        options: Options of every engaged cluster.
        probe_interval: Seconds between health probes of each cluster.
        debounce: Seconds without further events before a burst of events is acted on.
        removal_delay: Seconds a file must stay missing, or a context unlisted,
            before its cluster is disengaged.
        rescan_interval: Seconds between full rescans when nothing is reported.
        max_file_bytes: A file larger than this is refused (reported with its
            path and the limit) without being read.
        backoff: How long discovery waits after a pass that failed (default:
            0.2 s doubling to 30 s).
    """

    def __init__(
        self,
        paths: PathInput | None = None,
        *,
        include: Sequence[str] = DEFAULT_INCLUDE,
        recursive: bool = False,
        contexts: ContextSelection = "all",
        naming: Naming = "file/context",
        trust: mcr.TrustPolicy | None = None,
        options: mcr.ClusterOptions | None = None,
        probe_interval: float | None = None,
        debounce: float = 0.02,
        removal_delay: float = 0.5,
        rescan_interval: float = 30.0,
        max_file_bytes: int = MAX_FILE_BYTES,
        backoff: mcr.Backoff | None = None,
    ) -> None:
        if debounce < 0 or removal_delay < 0 or rescan_interval <= 0:
            raise ValueError("debounce and removal_delay must be >= 0 and rescan_interval > 0")
        if isinstance(include, str):
            include = (include,)
        self.inputs = _inputs(paths)
        self.include = tuple(include)
        self.recursive = recursive
        self.debounce = debounce
        self.removal_delay = removal_delay
        self.rescan_interval = rescan_interval
        self._select = context_filter(contexts)
        self._name = naming_function(naming)
        self._trust = trust or mcr.TrustPolicy.untrusted()
        self._reader = FileReader(self._select, self._trust, max_file_bytes)
        self._found: dict[str, Found] = {}  # the last pass's files by path: not built again by the next
        self._backoff = backoff or mcr.Backoff()
        self._owner = f"kubeconfig files {[str(path) for path in self.inputs]}"
        super().__init__(self._owner, options=options, probe_interval=probe_interval)
        self._files: dict[Path, _File] = {}
        self._holders: dict[str, tuple[Path, str]] = {}  # cluster name -> (file, context)
        self._statuses: dict[str, mcrp.SourceStatus] = {}  # files and contexts, as last acted on
        self._problems: dict[Path, str] = {}  # paths that could not be searched, from the last pass
        self._reported: dict[tuple[str, str], str] = {}  # (path, context or "") -> the problem logged
        self._changed = asyncio.Event()
        self._watcher: DirectoryWatcher | None = None
        self.passes = 0
        self.failed_passes = 0
        # What the last settled pass saw: a rescan that finds the very same readings (the
        # reader hands back the same objects for files that did not move) acts on nothing.
        self._settled: tuple[tuple[Found, ...], list[Reading], tuple[tuple[Path, str], ...]] | None = None

    def __repr__(self) -> str:
        inputs = [str(path) for path in self.inputs]
        return f"<KubeconfigFileProvider inputs={inputs} clusters={self.clusters.names()}>"

    # Reporting (get, index_field and statuses come from ClusterSetProvider).

    def sources(self) -> dict[str, mcrp.SourceStatus]:
        """What the last pass made of each kubeconfig file and each selected context, in input order.

        A file is keyed by its absolute path as seen (kind ``"kubeconfig
        file"``: ``version`` is the SHA-256 of the content read, ``None`` while
        it is missing; ``error`` a file-level problem, in which case every
        context keeps its last good config; ``detail["removing"]`` the
        contexts, comma-separated, that left the file and are disengaged once
        it has stayed that way for ``removal_delay``). A path that could not be
        searched (an unreadable directory, a symlink loop) is reported the
        same way. Each selected context follows its file, keyed
        ``"<path>#<context>"`` (kind ``"kubeconfig context"``, ``detail``
        ``file``, ``context`` and ``duplicate_of``).
        """
        return dict(self._statuses)

    @property
    def max_file_bytes(self) -> int:
        """The size limit of a kubeconfig file, in bytes."""
        return self._reader.max_bytes

    @property
    def file_reads(self) -> int:
        """How many times a file's content was read (unchanged files are not read again)."""
        return self._reader.reads

    @property
    def file_parses(self) -> int:
        """How many times a file's content was parsed (equal content is not parsed again)."""
        return self._reader.parses

    def rescan(self) -> None:
        """Ask for a pass now (for tools; events and the periodic rescan do it anyway)."""
        self._changed.set()

    # Discovery.

    async def run(self, aware: mcr.Aware) -> None:
        """Watch the files and keep the engaged clusters equal to them until cancelled."""
        watcher = self._watcher = DirectoryWatcher(
            self._changed, step=self.debounce, owner=self._owner, backoff=self._backoff
        )
        engaging = asyncio.create_task(self.clusters.run(aware), name=f"{self._owner}:clusters")
        watching = asyncio.create_task(watcher.run(), name=f"{self._owner}:watcher")
        try:
            await self._follow(watcher)
        finally:
            # Discovery has ended, so no change is half applied: stop the watches, then every cluster.
            watcher.close()
            await asyncio.gather(watching, return_exceptions=True)
            engaging.cancel()
            await asyncio.gather(engaging, return_exceptions=True)

    async def _follow(self, watcher: DirectoryWatcher) -> None:
        """Level-triggered: after any event or deadline, make the ClusterSet match the files."""
        loop = asyncio.get_running_loop()
        failures = 0
        logged: str | None = None
        self._changed.set()
        while True:
            wake = self.rescan_interval
            try:
                due = await self._pass(watcher, loop.time())
                failures, logged = 0, None
                if due is not None:
                    wake = min(wake, max(0.0, due - loop.time()))
            except asyncio.CancelledError:
                raise
            except Exception as error:  # one bad pass never ends discovery: retry with backoff
                wake = self._backoff.delay(failures)
                failures += 1
                self.failed_passes += 1
                message = f"{type(error).__name__}: {error}"
                log.log(  # each new failure with its traceback; the same one again at DEBUG only
                    logging.ERROR if message != logged else logging.DEBUG,
                    "%s: a pass over the files failed (%d in a row); retrying in %.1fs",
                    self._owner,
                    failures,
                    wake,
                    exc_info=True,
                )
                logged = message
            try:
                async with asyncio.timeout(wake):
                    await self._changed.wait()
            except TimeoutError:
                pass

    async def _pass(self, watcher: DirectoryWatcher, now: float) -> float | None:
        """One full look at the inputs; returns when the next pending removal is due."""
        self._changed.clear()
        layout = await asyncio.to_thread(find_files, self.inputs, self.include, self.recursive, self._found)
        readings = await asyncio.to_thread(self._reader.read_all, layout.files)
        referenced = frozenset().union(*(reading.watch for reading in readings)) if readings else frozenset()
        watcher.want(layout.watch | referenced, layout.watch_recursive, layout.interest.including(referenced))
        if self._unchanged(layout, readings):
            self.passes += 1  # 10,000 unchanged files: no O(N) fold, sync and report on the event loop
            return None
        self._settled = None
        due = self._apply(layout, readings, now)
        self._problems = dict(layout.problems)
        desired, holders = self._desired()
        await self.clusters.sync(desired)  # finishes even if cancelled: a started replacement must end
        self._holders = holders
        self._statuses = self._report()  # published once acted on: what tests settle on
        self.passes += 1
        if due is None and len(self.clusters) == len(desired):
            self._settled = (layout.files, readings, layout.problems)
        return due

    def _unchanged(self, layout: Layout, readings: list[Reading]) -> bool:
        settled = self._settled
        if settled is None:
            return False
        files, known, problems = settled
        return (
            layout.files == files
            and layout.problems == problems
            and len(readings) == len(known)
            and all(new is old for new, old in zip(readings, known, strict=True))
            and len(self.clusters) == len(self._holders)
        )

    def _apply(self, layout: Layout, readings: list[Reading], now: float) -> float | None:
        """Fold one pass's readings into what is known; returns the next removal deadline."""
        due: list[float] = []
        listed: set[Path] = set()
        for order, reading in enumerate(readings):
            found = layout.files[order]
            state = self._files.get(reading.path)
            if not reading.exists:
                continue  # handled with the files no longer listed, below
            listed.add(reading.path)
            if state is None:
                state = self._files[reading.path] = _File(found, order)
            state.found, state.order, state.missing_since = found, order, None
            state.digest, state.ignored = reading.digest, reading.ignored
            if reading.contexts is None:  # the file as a whole is unusable: every context keeps its config
                state.error = reading.error
                state.leaving.clear()
                continue
            state.error = None
            current = {item.context: item for item in reading.contexts}
            for item in reading.contexts:
                context = state.contexts.setdefault(item.context, _Context())
                if item.config is not None:
                    context.config, context.error = item.config, None
                else:
                    context.error = item.error
                state.leaving.pop(item.context, None)
            # The order of contexts follows the file, for deterministic duplicate resolution.
            ordered = {name: state.contexts[name] for name in current}
            for name, context in state.contexts.items():
                if name in current or context.config is None:
                    continue
                since = state.leaving.setdefault(name, now)
                if now - since < self.removal_delay:
                    ordered[name] = context  # maybe a writer in the middle of a rewrite: wait
                    due.append(since + self.removal_delay)
                else:
                    del state.leaving[name]
            state.contexts = ordered
        for path, state in list(self._files.items()):
            if path in listed:
                continue
            engaged = any(context.config is not None for context in state.contexts.values())
            state.missing_since = now if state.missing_since is None else state.missing_since
            if not engaged or now - state.missing_since >= self.removal_delay:
                del self._files[path]
            else:
                due.append(state.missing_since + self.removal_delay)
        self._files = dict(sorted(self._files.items(), key=lambda item: item[1].order))
        return min(due) if due else None

    def _desired(self) -> tuple[dict[str, mcr.ClusterConfig], dict[str, tuple[Path, str]]]:
        """The clusters the files ask for; a name claimed twice stays with its holder, else the first."""
        claims: dict[str, list[tuple[Path, str]]] = {}
        for path, state in self._files.items():
            for name, context in state.contexts.items():
                cluster = self._cluster_name(path, name)
                if context.config is not None and cluster:
                    claims.setdefault(cluster, []).append((path, name))
        desired: dict[str, mcr.ClusterConfig] = {}
        holders: dict[str, tuple[Path, str]] = {}
        for cluster, claimants in claims.items():
            holder = self._holders.get(cluster)
            if holder not in claimants:
                holder = claimants[0]
            holders[cluster] = holder
            config = self._files[holder[0]].contexts[holder[1]].config
            assert config is not None
            desired[cluster] = config
        return desired, holders

    def _cluster_name(self, path: Path, context: str) -> str | None:
        try:
            return self._name(path, context) or None
        except Exception as error:  # a user's naming function: report it as the context's problem
            self._files[path].contexts[
                context
            ].error = f"{path}, context {context!r}: naming failed ({type(error).__name__})"
            return None

    def _report(self) -> dict[str, mcrp.SourceStatus]:
        """A source per file, then per context; each new problem is logged once, naming both."""
        statuses: dict[str, mcrp.SourceStatus] = {}
        seen: set[tuple[str, str]] = set()
        for path, state in self._files.items():
            if state.ignored and not state.contexts:
                continue
            key = str(path)
            missing = state.missing_since is not None
            self._log_once((key, ""), None if missing else state.error, seen)
            statuses[key] = file_source(
                key,
                digest=None if missing else state.digest,
                error=None if missing else state.error,
                removing=tuple(state.contexts if missing else state.leaving),
            )
            for name, context in state.contexts.items():
                cluster = self._cluster_name(path, name)
                holder = self._holders.get(cluster) if cluster else None
                duplicate_of = None
                error = context.error
                if holder is not None and holder != (path, name) and context.config is not None:
                    duplicate_of = f"{holder[0]}#{holder[1]}"
                    error = (
                        f"{path}, context {name!r}: cluster name {cluster!r} is already provided by "
                        f"context {holder[1]!r} of {holder[0]}; this context is ignored"
                    )
                source = context_source(
                    key,
                    name,
                    cluster=cluster,
                    engaged=holder == (path, name),
                    error=error,
                    stale=context.config is not None and (context.error or state.error) is not None,
                    duplicate_of=duplicate_of,
                )
                statuses[source.name] = source
                self._log_once((key, name), error, seen)
                if context.config is not None and context.config.insecure:
                    insecure = f"{path}, context {name!r}: TLS verification is off (trust allows it)"
                    self._log_once((key, f"{name}:insecure"), insecure, seen)
        for path, problem in self._problems.items():  # what could not be searched: a source of its own
            key = str(path)
            self._log_once((key, ""), problem, seen)
            statuses.setdefault(key, file_source(key, digest=None, error=problem))
        self._reported = {key: value for key, value in self._reported.items() if key in seen}
        return statuses

    def _log_once(self, key: tuple[str, str], error: str | None, seen: set[tuple[str, str]]) -> None:
        if error is None:
            return
        seen.add(key)
        if self._reported.get(key) != error:
            self._reported[key] = error
            log.warning("%s: %s", self._owner, printable(error))  # names from files: no forged lines
