"""Removes a container-backend session's containers once the process that owns them is gone.

Started by :class:`~mcruntime.testing._containers.ContainerBackend` with the
first container, in a session of its own so that neither a Ctrl-C nor the death
of the test process stops it. It polls the owner (pid and start time, so a
reused pid does not fool it) and, when the owner has ended, removes every
container labelled with the session, then exits. An owner that cleans up after
itself terminates the reaper first.

Usage: ``python -m mcruntime.testing._reaper <owner pid:start time> <session>``
"""

from __future__ import annotations

import sys
import time

from ._containers import owner_alive, remove_containers

POLL_SECONDS = 0.5


def main(argv: list[str]) -> int:
    """Wait for the owner to end, then remove the session's containers; returns the exit code."""
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    owner, session = argv
    while owner_alive(owner):
        time.sleep(POLL_SECONDS)
    from docker import from_env

    client = from_env()
    # Containers may still be starting when the owner dies: sweep until none is left.
    for _attempt in range(10):
        if not remove_containers(client, session=session):
            break
        time.sleep(POLL_SECONDS)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
