"""The event path's counters and histograms expose what prometheus_client's own would.

They are plain numbers read at scrape time (``_manager/hot_series.py``); a
dashboard built on controller-runtime's names must not see a difference.
"""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from mcruntime._manager.hot_series import CounterFamily, HistogramFamily

BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
OBSERVED = (0.0, 0.005, 0.0051, 0.3, 1.0, 59.9, 60.0, 61.0, 1e9)


def _lines(registry: CollectorRegistry) -> list[str]:
    """The exposition, with the value of ``_created`` samples (the time each series was made) cut."""
    text = generate_latest(registry).decode()
    return [line.rsplit(" ", 1)[0] if "_created" in line else line for line in text.splitlines()]


def test_a_histogram_exposes_the_same_buckets_count_and_sum() -> None:
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    family = HistogramFamily("work_seconds", "Work.", ("controller", "cluster"), buckets=BUCKETS)
    ours.register(family)
    reference = Histogram(
        "work_seconds", "Work.", ("controller", "cluster"), buckets=BUCKETS, registry=theirs
    )
    for value in OBSERVED:
        family.labels("c", "east").observe(value)
        reference.labels("c", "east").observe(value)
    family.labels("c", "west").observe(0.02)
    reference.labels("c", "west").observe(0.02)
    assert _lines(ours) == _lines(theirs)


def test_a_counter_exposes_the_same_total_and_a_removed_series_goes() -> None:
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    family = CounterFamily("adds_total", "Adds.", ("cluster",))
    ours.register(family)
    reference = Counter("adds_total", "Adds.", ("cluster",), registry=theirs)
    for cluster, amount in (("east", 1.0), ("east", 2.5), ("west", 1.0)):
        family.labels(cluster).inc(amount)
        reference.labels(cluster).inc(amount)
    assert _lines(ours) == _lines(theirs)
    family.remove("west")
    reference.remove("west")
    assert _lines(ours) == _lines(theirs)
    with pytest.raises(KeyError):
        family.remove("west")


def test_labels_are_taken_by_name_as_prometheus_client_takes_them() -> None:
    # 1.0 exposed prometheus_client's own families: labels(controller=...) worked.
    family = CounterFamily("reconcile_total", "Reconciles.", ("controller", "result"))
    assert family.labels(result="success", controller="c") is family.labels("c", "success")
    with pytest.raises(ValueError, match="labels controller, result expected by position or by name"):
        family.labels(controller="c")
    with pytest.raises(ValueError, match="got 1 by position and result by name"):
        family.labels("c", result="success")


def test_wrong_label_counts_and_unordered_buckets_are_refused_by_name() -> None:
    with pytest.raises(ValueError, match="adds_total: 1 label values expected, got 2"):
        CounterFamily("adds_total", "Adds.", ("cluster",)).labels("a", "b")
    with pytest.raises(ValueError, match="work_seconds: bucket bounds"):
        HistogramFamily("work_seconds", "Work.", (), buckets=(1.0, 0.5))


def test_a_registry_refuses_a_second_family_of_the_same_name() -> None:
    registry = CollectorRegistry(auto_describe=True)
    registry.register(CounterFamily("adds_total", "Adds.", ("cluster",)))
    with pytest.raises(ValueError, match="Duplicated timeseries"):
        Counter("adds_total", "Adds.", ("cluster",), registry=registry)
