"""Per-cluster metric series: cached for speed, and dropped when their cluster leaves."""

from __future__ import annotations

import mcruntime as mcr
from mcruntime._manager.metrics import ManagerMetrics


def _reconciles(metrics: ManagerMetrics, cluster: str, result: str = "success") -> float | None:
    return metrics.registry.get_sample_value(
        "controller_runtime_reconcile_total", {"controller": "ctl", "result": result, "cluster": cluster}
    )


def test_a_departed_clusters_series_are_dropped_and_others_kept() -> None:
    metrics = ManagerMetrics(list, dict, dict)
    for cluster in ("east", "west"):
        metrics.cluster_engaged(cluster)
        metrics.observe_reconcile("ctl", mcr.Request(cluster, "ns", "a"), "success", 0.01)
        metrics.observe_reconcile("ctl", mcr.Request(cluster, "ns", "a"), "error", 0.01)
    sample = metrics.registry.get_sample_value
    assert _reconciles(metrics, "east") == 1
    metrics.cluster_disengaged("east")
    assert _reconciles(metrics, "east") is None
    assert (
        sample("controller_runtime_reconcile_errors_total", {"controller": "ctl", "cluster": "east"}) is None
    )
    assert _reconciles(metrics, "west", "error") == 1
    assert sample("mcruntime_cluster_engagements_total") == 2
    assert sample("mcruntime_cluster_disengagements_total") == 1
    # A cluster that comes back starts its series afresh.
    metrics.cluster_engaged("east")
    metrics.observe_reconcile("ctl", mcr.Request("east", "ns", "a"), "success", 0.01)
    assert _reconciles(metrics, "east") == 1


def test_a_late_observation_for_a_departed_cluster_creates_no_series() -> None:
    metrics = ManagerMetrics(list, dict, dict)
    metrics.cluster_engaged("gone")
    queue = metrics.queue_metrics("ctl")
    queue.on_add("key", "gone")
    metrics.cluster_disengaged("gone")
    before = metrics.registry.collect()
    names_before = sorted(sample.name for family in before for sample in family.samples)
    # A reconcile that was in flight when its cluster left finishes now, and retries.
    metrics.observe_reconcile("ctl", mcr.Request("gone", "ns", "a"), "error", 0.01)
    queue.on_retry("key", "gone")
    queue.on_add("key", "gone")
    after = sorted(sample.name for family in metrics.registry.collect() for sample in family.samples)
    assert after == names_before
    assert _reconciles(metrics, "gone", "error") is None
    assert "gone" not in {
        sample.labels.get("cluster") for family in metrics.registry.collect() for sample in family.samples
    }
