"""What a fleet leaves on disk: its key material goes when it stops, or at the next start if it was killed.

A control plane's directory holds private keys, a token file and admin
kubeconfigs (0600); etcd's data directory holds every Secret a test wrote. A
fleet in a directory of its own removes the whole directory when it stops. One
given a directory (pytest's ``tmp_path``, which pytest keeps for three runs; the
demo's) keeps the logs and certificates for the post-mortem and deletes the
rest, and only what it wrote itself: each directory it writes secrets to is
marked with its owner (pid and start time, so that a reused pid does not pass
for it). A process that is killed (SIGKILL, a crash) cannot clean up: the next
fleet to start sweeps the marked directories whose owner is gone.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import tempfile
from collections.abc import Iterable
from pathlib import Path

from ._containers import owner_alive, process_identity

log = logging.getLogger("mcruntime.testing")

OWNER_FILE = ".mcruntime-owner"
OWN_PREFIX = "mcruntime-testbed-"  # the directories a fleet makes for itself
ETCD_DATA = "etcd-data"
_SECRET_SUFFIXES = (".key", ".kubeconfig")
_SECRET_NAMES = frozenset({"tokens.csv"})
_PLANE = "plane"  # a control plane's directory: every secret file under it is ours
_ETCD = "etcd"  # the directory holding our etcd's data, and maybe other things
_LARGEST_SWEEP = 200  # markers looked at per start: a bound on a crowded temporary directory
_DEEPEST = 5  # pytest-N/popen-gwK/testbedK/fleet/cluster-N


def mark_owner(directory: Path, *, plane: bool) -> None:
    """Record this process as the owner of the secrets it writes in ``directory``."""
    identity = process_identity(os.getpid())
    if identity is None:
        return
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    (directory / OWNER_FILE).write_text(f"{identity} {_PLANE if plane else _ETCD}\n")


def scrub(directory: Path, *, plane: bool) -> None:
    """Delete what this process wrote there that holds a secret; logs and certificates stay.

    ``plane``: every key, token file and kubeconfig under ``directory``;
    otherwise only etcd's data directory.
    """
    shutil.rmtree(directory / ETCD_DATA, ignore_errors=True)
    if plane:
        for root, _directories, files in os.walk(directory):
            for name in files:
                if name in _SECRET_NAMES or name.endswith(_SECRET_SUFFIXES):
                    with contextlib.suppress(OSError):  # best effort: already gone
                        os.unlink(Path(root) / name)
    with contextlib.suppress(OSError):
        os.unlink(directory / OWNER_FILE)


def sweep_abandoned(given: Iterable[Path] = ()) -> None:
    """Clean up after fleets whose process died without stopping them.

    A directory a fleet made for itself (``mcruntime-testbed-*`` in the
    temporary directory) goes as a whole. Under the ``given`` roots (pytest's
    temporary root), each marked directory loses its key material.
    """
    seen = 0
    for workdir in Path(tempfile.gettempdir()).glob(f"{OWN_PREFIX}*"):
        if seen >= _LARGEST_SWEEP:
            return
        seen += 1
        if _abandoned(workdir):
            log.info("removing %s: the process that ran its fleet is gone", workdir)
            shutil.rmtree(workdir, ignore_errors=True)
    for root in given:
        for depth in range(1, _DEEPEST + 1):
            for marker in root.glob("/".join(["*"] * depth) + "/" + OWNER_FILE):
                if seen >= _LARGEST_SWEEP:
                    return
                seen += 1
                directory = marker.parent
                owner = _owner(directory)
                if owner is not None and _abandoned(directory):
                    log.info("deleting the keys in %s: the process that ran its fleet is gone", directory)
                    scrub(directory, plane=owner[1] == _PLANE)


def _owner(directory: Path) -> tuple[str, str] | None:
    try:
        fields = (directory / OWNER_FILE).read_text()[:100].split()
    except OSError:
        return None  # not a fleet's, or one that stopped cleanly
    return (fields[0], fields[1]) if len(fields) == 2 else None


def _abandoned(directory: Path) -> bool:
    owner = _owner(directory)
    return owner is not None and not owner_alive(owner[0])
