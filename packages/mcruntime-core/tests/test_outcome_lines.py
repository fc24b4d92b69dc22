"""What a failed reconcile logs: RBAC's 403 is named once by its cluster's record, not per object and retry.

A 403 that is not RBAC's (an admission plugin refusing writes into a
Terminating namespace, a webhook, a policy) is recorded nowhere else, so it is
a WARNING: at DEBUG it failed forever with /readyz green and nothing in the log.
"""

from __future__ import annotations

import logging

import pytest

import mcruntime as mcr
from mcruntime._control.outcomes import ReconcileStats, apply_failure
from mcruntime.workqueue import WorkQueue


@pytest.mark.parametrize(
    ("error", "level"),
    [
        (
            mcr.Forbidden(
                'configmaps is forbidden: User "ci" cannot create resource "configmaps"',
                cluster="west",
                status=403,
            ),
            logging.DEBUG,
        ),
        (
            mcr.Forbidden(
                'configmaps "copy" is forbidden: unable to create new content in namespace dst '
                "because it is being terminated",
                cluster="west",
                status=403,
            ),
            logging.WARNING,
        ),
        (mcr.Conflict("the object has been modified", cluster="west", status=409), logging.INFO),
    ],
    ids=["rbac", "admission", "conflict"],
)
async def test_a_refusal_is_retried_quietly_and_a_conflict_visibly(
    error: Exception, level: int, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="mcruntime.controller")
    queue: WorkQueue[mcr.Request] = WorkQueue()
    request = mcr.Request("west", "default", "w5")
    outcome = apply_failure("widgets", queue, ReconcileStats(), request, error, lambda _r, _e: False)
    assert outcome == "error"
    [record] = [r for r in caplog.records if r.name == "mcruntime.controller"]
    assert record.levelno == level and "west:default/w5" in record.getMessage()
    assert queue.num_requeues(request) == 1  # retried all the same
    queue.shut_down()
