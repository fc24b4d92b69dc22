"""The simulated kubelet: finishes job-fanout's Jobs on clusters that have no nodes.

A Job runs when kube-controller-manager's job controller makes a Pod, the
scheduler puts it on a node, the node's kubelet runs it, and the job controller
writes the outcome into the Job's status. The testbed runs only kube-apiserver
and etcd, so none of that happens and every Job would stay pending forever.
This component stands in for all of it, and only for Jobs that carry
job-fanout's label: it writes ``startTime`` and ``active: 1`` (the Job is
"running"), waits ``run_seconds``, then writes what the job controller writes
for a finished Job, which the API server validates (1.36):

- success: ``succeeded: 1``, ``completionTime`` (not before ``startTime``), and
  the conditions ``SuccessCriteriaMet`` then ``Complete``;
- failure (the Job is annotated ``demo.mcruntime.dev/simulated-outcome: fail``,
  from the Test's ``spec.failIn``): ``failed: 1`` and the conditions
  ``FailureTarget`` then ``Failed`` (reason ``BackoffLimitExceeded``), no
  ``completionTime``.

Never run it against clusters with real nodes: the real job controller owns
those Jobs' status.
"""

from __future__ import annotations

import datetime
import hashlib
import logging
from typing import Any

import mcruntime as mcr
from job_fanout import JOB, OUTCOME_ANNOTATION, TEST_LABEL, display_name

log = logging.getLogger("simulated_kubelet")

FIELD_MANAGER = "simulated-kubelet"


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC).replace(microsecond=0)


def _timestamp(moment: datetime.datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def _parse(timestamp: str) -> datetime.datetime:
    return datetime.datetime.strptime(timestamp, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=datetime.UTC)


def _condition(kind: str, reason: str, message: str, at: str) -> dict[str, str]:
    return {
        "type": kind,
        "status": "True",
        "reason": reason,
        "message": message,
        "lastProbeTime": at,
        "lastTransitionTime": at,
    }


def finished(job: dict[str, Any]) -> bool:
    """Whether the Job already has a terminal condition (then nothing is left to simulate)."""
    return any(
        c.get("type") in ("Complete", "Failed") and c.get("status") == "True"
        for c in (job.get("status") or {}).get("conditions") or []
    )


class SimulatedKubelet:
    """A controller over job-fanout's Jobs in every cluster that plays node and job controller.

    ``run_seconds`` is how long a Job "runs"; each Job gets a share of
    ``spread`` on top, derived from its cluster and name, so the Jobs of one
    Test do not all finish in the same instant.
    """

    def __init__(
        self,
        manager: mcr.Manager,
        *,
        namespace: str | None = None,
        run_seconds: float = 1.0,
        spread: float = 2.0,
    ) -> None:
        self.manager = manager
        self.namespace = namespace
        self.run_seconds = run_seconds
        self.spread = spread

    def setup(self) -> mcr.Controller:
        """Wire the controller into the manager: job-fanout's Jobs, in every cluster."""
        return (
            mcr.controller_managed_by(self.manager)
            .named("simulated-kubelet")
            .for_(JOB, clusters=mcr.EVERY_CLUSTER, namespace=self.namespace, label_selector=TEST_LABEL)
            .with_options(max_concurrent_reconciles=4)
            .complete(self)
        )

    def duration(self, request: mcr.Request) -> float:
        """How long this Job runs: stable for a Job, different across Jobs."""
        digest = hashlib.sha256(str(request).encode()).digest()
        return self.run_seconds + self.spread * digest[0] / 255

    async def reconcile(self, request: mcr.Request) -> mcr.Result | None:
        """Start the Job, then after its run time finish it as the job controller would."""
        try:
            return await self._reconcile(request)
        except mcr.Conflict:  # our cache was behind; read again
            return mcr.Result(requeue=True)
        except mcr.NotFound:  # deleted meanwhile: nothing left to run
            return None

    async def _reconcile(self, request: mcr.Request) -> mcr.Result | None:
        cluster = await self.manager.get_cluster(request.cluster)
        job = await cluster.cache.get(JOB, request.name, namespace=request.namespace)
        if job is None or finished(job) or job["metadata"].get("deletionTimestamp"):
            return None
        status: dict[str, Any] = job.setdefault("status", {})
        now = _now()
        if not status.get("startTime"):
            status.update(startTime=_timestamp(now), active=1)
            await cluster.client.update_status(job, field_manager=FIELD_MANAGER)
            return mcr.Result(requeue_after=self.duration(request))
        started = _parse(status["startTime"])
        remaining = self.duration(request) - (now - started).total_seconds()
        if remaining > 0:
            return mcr.Result(requeue_after=remaining)
        at = _timestamp(max(now, started))
        failing = (job["metadata"].get("annotations") or {}).get(OUTCOME_ANNOTATION) == "fail"
        status.update(active=0, ready=0)
        if failing:
            message = "Job has reached the specified backoff limit"
            status["failed"] = 1
            status["conditions"] = [
                _condition("FailureTarget", "BackoffLimitExceeded", message, at),
                _condition("Failed", "BackoffLimitExceeded", message, at),
            ]
        else:
            message = "Reached expected number of succeeded pods"
            status.update(succeeded=1, completionTime=at)
            status["conditions"] = [
                _condition("SuccessCriteriaMet", "CompletionsReached", message, at),
                _condition("Complete", "CompletionsReached", message, at),
            ]
        await cluster.client.update_status(job, field_manager=FIELD_MANAGER)
        log.info(
            "simulated kubelet: Job %s/%s in cluster %s %s",
            request.namespace,
            request.name,
            display_name(request.cluster),
            "failed" if failing else "succeeded",
        )
        return None
