"""Declaring Prometheus metric families into one registry, one call a family.

A family is its kind, name, help and label names (and a histogram's buckets). `Families` holds
the registry, so each declaration states only those facts, and a label set several families
share is a named tuple beside them (a version gauge's `VERSION`), not a list written again at
each. Every app builds its own registry (prometheus_client's default one is process-wide), so
tests can run several servers in one process. The serving API's metrics (metrics.py) and the
search router's (search/router/search_metrics.py) are declared through it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from sluice.observability.loop_histogram import LoopHistogram

# a series per model version: the model and `<model>/<version>`, bounded by the fleet file
VERSION = ("model", "version")


@dataclasses.dataclass(slots=True)
class Families:
    registry: CollectorRegistry = dataclasses.field(default_factory=CollectorRegistry)

    def counter(self, name: str, doc: str, labels: Sequence[str] = ()) -> Counter:
        return Counter(name, doc, labels, registry=self.registry)

    def gauge(self, name: str, doc: str, labels: Sequence[str] = ()) -> Gauge:
        return Gauge(name, doc, labels, registry=self.registry)

    def histogram(self, name: str, doc: str, buckets: Sequence[float], labels: Sequence[str] = ()) -> Histogram:
        return Histogram(name, doc, labels, buckets=buckets, registry=self.registry)

    def loop_histogram(
        self, name: str, doc: str, buckets: Sequence[float], labels: Sequence[str] = ()
    ) -> LoopHistogram:
        """A histogram observed only from one thread's hot path (loop_histogram.py: no lock)."""
        return LoopHistogram(name, doc, buckets, labels, self.registry)
