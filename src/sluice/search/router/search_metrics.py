"""The search router's Prometheus metrics (one registry per router, so tests can run several).

Labels are bounded by the config: shard name, replica name (`<shard>/<index>`), phase
(stats | search | write), error type — never a query, a document id or a key.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any, Protocol

from prometheus_client import Gauge
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from sluice.observability.families import Families

# fine enough that a 2 ms shard's p50 and p99 fall in buckets of their own (0.25–0.5 ms wide
# below 3 ms), and up to the longest deadline a config allows in steps of ~1.5–2×
_SHARD = (
    0.00025,
    0.0005,
    0.00075,
    0.001,
    0.00125,
    0.0015,
    0.00175,
    0.002,
    0.0025,
    0.003,
    0.004,
    0.005,
    0.0075,
    0.01,
    0.015,
    0.02,
    0.03,
    0.05,
    0.075,
    0.1,
    0.15,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
)
_QUERY = _SHARD


class SearchMetrics:
    def __init__(self) -> None:
        f = Families()
        self.registry = f.registry

        def per_replica(name: str, doc: str) -> Gauge:  # a replica's state, one series per shard/replica
            return f.gauge(name, doc, ("shard", "replica"))

        # the two the query path observes (five a query): observed only from the event loop
        self.query_latency = f.loop_histogram(
            "sluice_search_query_seconds", "End-to-end search latency at the router", _QUERY, ("outcome",)
        )
        self.replica_latency = f.histogram(
            "sluice_search_replica_request_seconds",
            "Latency of one request to one replica (per shard, replica and phase)",
            _SHARD,
            ("shard", "replica", "phase"),
        )
        self.shard_latency = f.loop_histogram(
            "sluice_search_shard_seconds",
            "Time until a shard answered (retries and hedges included)",
            _SHARD,
            ("shard", "phase"),
        )
        self.errors = f.counter(
            "sluice_search_errors",
            "Query errors by type: a shard's failure (timeout, unavailable, "
            "bad_query) or a refusal answered to the client (its error type: invalid_request_error, "
            "query_syntax_error, authentication_error, request_too_large, ...)",
            ("type",),
        )
        self.retries = f.counter(
            "sluice_search_extra_requests", "Second requests to a shard: failover or hedge", ("shard", "kind")
        )
        self.partial = f.counter("sluice_search_partial_results", "Searches answered without every shard")
        self.cache_hit_ratio = f.gauge("sluice_search_cache_hit_ratio", "Result cache hits / lookups since start")
        self.freshness = per_replica(
            "sluice_search_index_freshness_seconds",
            "Seconds since the replica's oldest unapplied write was acknowledged (0: current)",
        )
        self.replica_up = per_replica("sluice_search_replica_up", "1 when the replica answered its last health poll")
        self.applied_seq = per_replica("sluice_search_replica_applied_seq", "Last write-log entry the replica applied")
        self.log_entries = per_replica(
            "sluice_search_replica_log_entries", "Entries in the replica's write log (after compaction)"
        )
        self.head_seq = f.gauge("sluice_search_shard_head_seq", "Newest acknowledged write-log entry", ("shard",))
        self.documents = f.counter("sluice_search_documents_written", "Documents upserted or deleted", ("op",))
        self.bad_lines = f.counter("sluice_search_bad_ndjson_lines", "Bulk lines refused")
        self.restarts = f.counter(
            "sluice_search_local_replica_restarts", "Local replica processes restarted", ("shard", "replica")
        )
        self._children: dict[tuple[Any, ...], Any] = {}

    def watch_index_ages(self, ages: Callable[[], Iterable[tuple[str, str, float]]]) -> None:
        """sluice_search_index_age_seconds from `ages` — (shard, replica, seconds) for each replica
        with a known write — computed when scraped: a time since, as current as the scrape, where a
        value set at each health poll was as old as the poll, and absent until the first one."""
        self.registry.register(_IndexAges(ages))

    def watch_cache(self, cache: CacheCounts) -> None:
        """sluice_search_cache_requests_total{result} and sluice_search_cache_hit_ratio from the
        result cache's own counts, read when scraped: the cache counts each lookup anyway, and a
        Counter's inc per query (its lock, its label lookup) cost ~2 µs."""
        self.cache_hit_ratio.set_function(lambda: cache.hit_ratio)
        self.registry.register(_CacheRequests(cache))

    def error_counts(self) -> dict[str, int]:
        """The error counter's values by type (the status JSON)."""
        return {
            s.labels["type"]: int(s.value)
            for m in self.errors.collect()
            for s in m.samples
            if s.name.endswith("_total")
        }

    def refused(self, kind_value: str) -> None:
        self.child(self.errors, kind_value).inc()

    def child(self, metric: Any, *labels: str) -> Any:
        """metric.labels(*labels), remembered: the query path observes several per query and
        prometheus_client's labels() (validation, a lock, a lookup) costs ~7 µs each."""
        key = (id(metric), *labels)
        got = self._children.get(key)
        if got is None:
            got = self._children[key] = metric.labels(*labels)
        return got


class _IndexAges(Collector):
    NAME = "sluice_search_index_age_seconds"
    DOC = "Seconds since the replica's last applied write (by the time it was sequenced)"

    def __init__(self, ages: Callable[[], Iterable[tuple[str, str, float]]]) -> None:
        self.ages = ages

    def describe(self) -> Iterator[Metric]:
        yield GaugeMetricFamily(self.NAME, self.DOC, labels=("shard", "replica"))

    def collect(self) -> Iterator[Metric]:
        family = GaugeMetricFamily(self.NAME, self.DOC, labels=("shard", "replica"))
        for shard, replica, seconds in self.ages():
            family.add_metric((shard, replica), seconds)
        yield family


class CacheCounts(Protocol):
    """What the metrics read of the result cache (router/query/result_cache.py)."""

    hits: int
    lookups: int

    @property
    def hit_ratio(self) -> float: ...


class _CacheRequests(Collector):
    NAME = "sluice_search_cache_requests"
    DOC = "Result cache lookups by result (hit, miss)"

    def __init__(self, cache: CacheCounts) -> None:
        self.cache = cache

    def describe(self) -> Iterator[Metric]:
        yield CounterMetricFamily(self.NAME, self.DOC, labels=("result",))

    def collect(self) -> Iterator[Metric]:
        hits, lookups = self.cache.hits, self.cache.lookups
        family = CounterMetricFamily(self.NAME, self.DOC, labels=("result",))
        family.add_metric(("hit",), hits)
        family.add_metric(("miss",), lookups - hits)
        yield family
