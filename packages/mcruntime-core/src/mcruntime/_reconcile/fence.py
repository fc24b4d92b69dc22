"""Whether the work in progress may still write: checked by the client just before each write.

A sharded replica works on a cluster only while its share is good (its peer
Lease renewed in time), and a leader only while its Lease is. Stopping the work
is a task's job (the sharding watchdog, the elector's loop), and on a loop that
runs late a task may run after a reconcile that is ready at the same moment; a
reconcile that read before the share lapsed may write after. So the controller
puts the gate's check in the reconcile's context, and the transport asks it
right before sending anything that is not a read. Reads are harmless; a write
is where two replicas would race.

contextvars follow asyncio tasks, so a task a reconcile starts is checked too,
and the coordinator's own Lease writes (made outside any reconcile) are not.
"""

from __future__ import annotations

from collections.abc import Callable
from contextvars import ContextVar

WriteCheck = Callable[[], "str | None"]
"""``None`` while writes may go; otherwise why not, for the error the write raises."""

_check: ContextVar[WriteCheck | None] = ContextVar("mcruntime_write_check", default=None)


def enter_write_check(check: WriteCheck | None) -> object:
    """Guard this task's writes with ``check``; then call :func:`leave_write_check`."""
    return _check.set(check)


def leave_write_check(token: object) -> None:
    _check.reset(token)  # type: ignore[arg-type]


def write_refusal() -> str | None:
    """Why this task must not write now, or ``None`` (also outside any guarded work)."""
    check = _check.get()
    return None if check is None else check()
