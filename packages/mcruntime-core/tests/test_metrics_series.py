"""Per-cluster metric series: cached for speed, and dropped when their cluster leaves."""

from __future__ import annotations

import mcruntime as mcr


def test_a_departed_clusters_series_are_dropped_and_others_kept() -> None:
    metrics = mcr.ManagerMetrics(list, dict, dict)
    for cluster in ("east", "west"):
        metrics.observe_reconcile("ctl", mcr.Request(cluster, "ns", "a"), "success", 0.01)
        metrics.observe_reconcile("ctl", mcr.Request(cluster, "ns", "a"), "error", 0.01)
    sample = metrics.registry.get_sample_value
    assert (
        sample(
            "controller_runtime_reconcile_total",
            {"controller": "ctl", "result": "success", "cluster": "east"},
        )
        == 1
    )
    metrics.forget_cluster("east")
    assert (
        sample(
            "controller_runtime_reconcile_total",
            {"controller": "ctl", "result": "success", "cluster": "east"},
        )
        is None
    )
    assert (
        sample("controller_runtime_reconcile_errors_total", {"controller": "ctl", "cluster": "east"}) is None
    )
    assert (
        sample(
            "controller_runtime_reconcile_total", {"controller": "ctl", "result": "error", "cluster": "west"}
        )
        == 1
    )
    # A cluster that comes back starts its series afresh.
    metrics.observe_reconcile("ctl", mcr.Request("east", "ns", "a"), "success", 0.01)
    assert (
        sample(
            "controller_runtime_reconcile_total",
            {"controller": "ctl", "result": "success", "cluster": "east"},
        )
        == 1
    )
