"""Metric families declared through `Families`: each app's own registry, and the facts of a
declaration (kind, name, help, labels, buckets) as stated — the serving API's and the search
router's /metrics are built from these calls."""

from __future__ import annotations

from prometheus_client import generate_latest

from sluice.engine.stats import EngineStats
from sluice.observability.families import VERSION, Families
from sluice.observability.metrics import ServingMetrics
from sluice.search.router.search_metrics import SearchMetrics


def test_a_declaration_states_kind_name_help_labels_and_buckets():
    f = Families()
    f.counter("t_requests", "Requests by route", ("route",)).labels("a").inc()
    f.gauge("t_depth", "Queue depth").set(3)
    f.histogram("t_seconds", "Latency", (0.1, 1.0), ("phase",)).labels("x").observe(0.5)
    text = generate_latest(f.registry).decode()
    assert "# HELP t_requests_total Requests by route\n# TYPE t_requests_total counter" in text
    assert 't_requests_total{route="a"} 1.0' in text
    assert "# TYPE t_depth gauge\nt_depth 3.0" in text
    assert 't_seconds_bucket{le="0.1",phase="x"} 0.0' in text
    assert 't_seconds_bucket{le="1.0",phase="x"} 1.0' in text


def test_each_app_has_its_own_registry():
    """Two servers in one process (as the system tests run them) declare the same names."""
    first, second = ServingMetrics(), ServingMetrics()
    first.requests.labels("/v1/messages", "200", "none", "default").inc()
    assert first.registry is not second.registry
    assert b'sluice_http_requests_total{route="/v1/messages"' not in second.render()
    assert SearchMetrics().registry is not SearchMetrics().registry


def test_engine_and_version_gauges_carry_the_version_labels():
    """One series per model version, never per worker: every per-version gauge has exactly the
    shared label set (the fleet's workers add their state)."""
    m = ServingMetrics()
    per_version = [g for g, _ in m._engine_values(EngineStats())]
    per_version += [m.engine_up, m.warm_pool, m.lora_resident, m.lora_resident_bytes]
    assert {g._labelnames for g in per_version} == {VERSION}
    assert m.workers._labelnames == (*VERSION, "state")
