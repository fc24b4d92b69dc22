"""Reading only what changed: files are re-read when their stamp moves, else reused.

A watched directory may hold files we do not control, large ones included,
and every event or rescan triggers a pass over all of them. Reading and
parsing each file on each pass made one 50 MB file cost every pass tens of
seconds. So a pass first ``stat``s each file (through its symlinks) and reuses
the previous reading while its stamp (device, inode, size, mtime and ctime in
nanoseconds) and the stamps of the certificate and token files it refers to
are unchanged. A file whose content is unchanged after all (a Secret volume
swapped to an equal version) is read but not parsed again. A path that is no
regular file (a FIFO, a device, a directory) is refused from its ``stat``,
never opened, and keeps its refusal while its stamp holds.

A stamp only proves "unchanged" once it is old enough: file systems tick
their timestamps coarsely (milliseconds), so two same-size writes within one
tick share a stamp. Like git's racy-index rule, a reading taken less than
:data:`RACY_SECONDS` after the file's last write (its mtime) is not trusted,
and the next pass reads the file again.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import mcruntime as mcr

from ._scan import (
    MAX_FILE_BYTES,
    ContextFilter,
    Found,
    Reading,
    cannot_read,
    content_digest,
    not_a_file,
    parse_file,
    read_regular,
    referenced_files,
    special_kind,
    too_large,
)

RACY_SECONDS = 2.0
"""A stamp younger than this (against the clock at reading time) is not trusted to mean "unchanged"."""


class Stamp(NamedTuple):
    """What ``stat`` says about a file's identity and content, cheaply.

    A tuple, not a dataclass: a rescan builds and compares one per file, and
    a frozen dataclass's constructor and ``==`` cost 2.5 µs against a tuple's 1
    (15 ms more per pass at 10,000 files).
    """

    device: int
    inode: int
    size: int
    mtime_ns: int
    ctime_ns: int

    @classmethod
    def of(cls, result: os.stat_result) -> Stamp:
        return cls(result.st_dev, result.st_ino, result.st_size, result.st_mtime_ns, result.st_ctime_ns)

    def settled(self, now_ns: int) -> bool:
        """Written long enough ago that a later write would show in the stamp (git's racy rule: mtime)."""
        return now_ns - self.mtime_ns >= RACY_SECONDS * 1e9


def _stamp(path: Path) -> Stamp | None:
    try:
        return Stamp.of(os.stat(path))
    except OSError:
        return None


@dataclass(frozen=True)
class _Known:
    """A reading, and the stamps it was made from."""

    stamp: Stamp
    referenced: tuple[tuple[Path, Stamp | None], ...]
    reading: Reading
    trusted: bool


class FileReader:
    """Reads kubeconfig files for a provider's passes, keeping what it read per file.

    Runs in a worker thread (one pass at a time). ``reads`` and ``parses``
    count the files actually read and parsed, for tests and tools.
    """

    def __init__(
        self, select: ContextFilter, trust: mcr.TrustPolicy, max_bytes: int = MAX_FILE_BYTES
    ) -> None:
        if max_bytes <= 0:
            raise ValueError(f"max_file_bytes must be positive, not {max_bytes}")
        self._select = select
        self._trust = trust
        self.max_bytes = max_bytes
        self._known: dict[Path, _Known] = {}
        self._refused: dict[Path, tuple[Stamp, Reading]] = {}  # paths that are no regular file
        self.reads = 0
        self.parses = 0

    def read_all(self, files: Iterable[Found]) -> list[Reading]:
        """One pass: a reading per file, in order; forgets files no longer listed."""
        listed = list(files)
        readings = [self.read(found) for found in listed]
        keep = {found.path for found in listed}
        for path in [path for path in self._known if path not in keep]:
            del self._known[path]
        for path in [path for path in self._refused if path not in keep]:
            del self._refused[path]
        return readings

    def read(self, found: Found) -> Reading:
        """The file as it is now: the previous reading if nothing it depends on moved."""
        path = found.path
        try:
            result = os.stat(path)
        except FileNotFoundError:
            self._known.pop(path, None)
            return Reading(path, exists=False)
        except OSError as error:
            self._known.pop(path, None)
            return cannot_read(path, error)
        stamp = Stamp.of(result)
        kind = special_kind(result.st_mode)
        if kind is not None:
            return self._refuse(path, stamp, kind)
        if self._refused:
            self._refused.pop(path, None)
        known = self._known.get(path)
        if known is not None and known.trusted and known.stamp == stamp and self._unmoved(known.referenced):
            return known.reading
        reading = self._fresh(found, stamp, known)
        now_ns = time.time_ns()
        referenced = tuple((ref, _stamp(ref)) for ref in sorted(referenced_files(reading)))
        trusted = stamp.settled(now_ns) and all(ref is None or ref.settled(now_ns) for _, ref in referenced)
        if reading.exists:
            self._known[path] = _Known(stamp, referenced, reading, trusted)
        else:
            self._known.pop(path, None)
        return reading

    def _refuse(self, path: Path, stamp: Stamp, kind: str) -> Reading:
        """A path that is no regular file: never opened (a FIFO would block the pass), refused by kind.

        The same reading while its stamp holds, so that a rescan finding it
        unchanged acts on nothing; the last good reading of the path is kept,
        for when a regular file with that content comes back.
        """
        held = self._refused.get(path)
        if held is not None and held[0] == stamp:
            return held[1]
        reading = not_a_file(path, kind)
        self._refused[path] = (stamp, reading)
        return reading

    def _fresh(self, found: Found, stamp: Stamp, known: _Known | None) -> Reading:
        """The file read and parsed (or refused), to be kept under ``stamp``.

        The name is opened after its ``stat``, so what is opened may be
        another file by then (a FIFO renamed over it): ``read_regular`` judges
        what it opened. A refusal kept under the old stamp is never handed out
        again, since no rename or link leaves a file's ctime as it was.
        """
        path = found.path
        if stamp.size > self.max_bytes:
            return too_large(path, stamp.size, self.max_bytes)  # never read
        content = read_regular(path, self.max_bytes)
        if isinstance(content, Reading):
            return content
        self.reads += 1
        digest = content_digest(content)
        if known is not None and known.reading.digest == digest and self._unmoved(known.referenced):
            return known.reading  # same bytes (a Secret volume swapped to an equal version): no parse
        self.parses += 1
        return parse_file(found, content, self._select, self._trust, digest)

    @staticmethod
    def _unmoved(referenced: tuple[tuple[Path, Stamp | None], ...]) -> bool:
        return all(_stamp(path) == stamp for path, stamp in referenced)
