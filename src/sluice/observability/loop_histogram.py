"""A labelled Prometheus histogram observed from one thread's hot path (an event loop).

Why not prometheus_client's Histogram there: its `observe` takes a lock twice (the sum, then the
bucket) and walks the bounds one by one, ~2 µs an observation, and the search router observes
five a query (each shard's answer in each round, and the query). Here an observation is a bisect
and two additions, without a lock: only the loop's thread observes. A scrape (any thread)
copies each child's counts in one step, so its buckets and count agree; its sum may miss an
observation made during the scrape, as Prometheus tolerates of any histogram read while it grows.

The exposition is prometheus_client's own (a HistogramMetricFamily from a custom collector, the
documented way to expose values kept elsewhere): the same `_bucket`, `_count` and `_sum` series,
without the `_created` series a Histogram adds (tests/unit/observability/test_loop_histogram.py
compares the two).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator, Sequence

from prometheus_client import CollectorRegistry
from prometheus_client.core import HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import INF, floatToGoString


class LoopHistogramChild:
    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds  # ends with +Inf
        self.counts = [0] * len(bounds)  # per bucket, not cumulative
        self.sum = 0.0

    def observe(self, amount: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, amount)] += 1  # the first bound ≥ amount: `le`
        self.sum += amount


class LoopHistogram(Collector):
    def __init__(
        self, name: str, doc: str, buckets: Sequence[float], labels: Sequence[str], registry: CollectorRegistry
    ) -> None:
        self.name, self.doc, self.labelnames = name, doc, tuple(labels)
        bounds = sorted(float(b) for b in buckets)
        self.bounds = tuple(bounds if bounds and bounds[-1] == INF else [*bounds, INF])
        self._les = [floatToGoString(b) for b in self.bounds]
        self._children: dict[tuple[str, ...], LoopHistogramChild] = {}
        registry.register(self)

    def labels(self, *values: str) -> LoopHistogramChild:
        if len(values) != len(self.labelnames):
            raise ValueError(f"{self.name}: labels {self.labelnames}, given {values}")
        key = tuple(str(v) for v in values)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = LoopHistogramChild(self.bounds)
        return child

    def describe(self) -> Iterator[Metric]:
        yield HistogramMetricFamily(self.name, self.doc, labels=self.labelnames)

    def collect(self) -> Iterator[Metric]:
        family = HistogramMetricFamily(self.name, self.doc, labels=self.labelnames)
        for key, child in list(self._children.items()):
            counts, total = list(child.counts), child.sum
            cumulative, buckets = 0, []
            for le, n in zip(self._les, counts):
                cumulative += n
                buckets.append((le, cumulative))
            family.add_metric(key, buckets, total)
        yield family
