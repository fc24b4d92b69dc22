"""Process limits a fleet needs: enough file descriptors for every cluster's connections.

Each engaged cluster holds a few sockets (watches, requests, the health probe),
so a thousand clusters exceed the usual soft ``RLIMIT_NOFILE`` of 1,024 while
the hard limit is far higher. Go's runtime raises the soft limit to the hard one
at start for the same reason; the manager does the same, so an operator never
has to run ``ulimit -n`` first. Failing to raise it is never fatal: the process
carries on with the limit it has.
"""

from __future__ import annotations

import logging
import sys

if sys.platform != "win32":  # Windows has no resource module and no such limit
    import resource

log = logging.getLogger("mcruntime.limits")


def raise_open_files_limit() -> tuple[int, int] | None:
    """Raise the soft ``RLIMIT_NOFILE`` to the hard limit; return ``(before, after)``, or None.

    None means the limit could not be read or changed (Windows, or the
    system refused); the reason is logged at DEBUG. Idempotent: a second
    call finds the soft limit already at the hard one and changes nothing.
    """
    if sys.platform == "win32":
        return None
    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (OSError, ValueError) as error:
        log.debug("could not read RLIMIT_NOFILE: %s", error)
        return None
    if soft == hard:
        return (soft, soft)
    target = hard
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (OSError, ValueError) as error:
        # e.g. macOS refuses RLIM_INFINITY for the soft limit; keep what we have
        log.debug("could not raise RLIMIT_NOFILE from %s to %s: %s", soft, target, error)
        return None
    log.debug("raised the open-files limit (RLIMIT_NOFILE) from %s to %s", soft, target)
    return (soft, target)
