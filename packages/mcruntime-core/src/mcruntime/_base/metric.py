"""Declaring the runtime's Prometheus metrics: one call each, always in a registry of its own.

Every metric mcruntime exports lives in a registry that belongs to one manager
(or one sharding), never in the process-wide default, so two managers in one
process never collide. :class:`Metrics` binds that registry once, so a
declaration says only what differs: name, help text, labels.
"""

from __future__ import annotations

from collections.abc import Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


class Metrics:
    """Declares counters, gauges and histograms in ``registry``."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry

    def counter(self, name: str, documentation: str, labels: Sequence[str] = ()) -> Counter:
        """A counter named ``name`` with these labels (none: one series)."""
        return Counter(name, documentation, labels, registry=self.registry)

    def gauge(self, name: str, documentation: str, labels: Sequence[str] = ()) -> Gauge:
        """A gauge named ``name`` with these labels (none: one series)."""
        return Gauge(name, documentation, labels, registry=self.registry)

    def histogram(
        self, name: str, documentation: str, labels: Sequence[str] = (), *, buckets: Sequence[float]
    ) -> Histogram:
        """A histogram named ``name`` with these labels and bucket bounds."""
        return Histogram(name, documentation, labels, buckets=buckets, registry=self.registry)
