"""The event loop's histogram (observability/loop_histogram.py) exposes what prometheus_client's
Histogram exposes for the same observations — bucket bounds on the edges included — less the
`_created` series."""

from __future__ import annotations

import random

import pytest
from prometheus_client import CollectorRegistry, Histogram, generate_latest

from sluice.observability.loop_histogram import LoopHistogram

BUCKETS = (0.00025, 0.0005, 0.001, 0.0025, 0.01, 0.1, 1.0)


def _without_created(text: bytes) -> list[str]:
    return [line for line in text.decode().splitlines() if "_created" not in line]


def test_the_exposition_equals_prometheus_clients_histogram():
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    loop = LoopHistogram("t_seconds", "a latency", BUCKETS, ("shard", "phase"), ours)
    reference = Histogram("t_seconds", "a latency", ("shard", "phase"), buckets=BUCKETS, registry=theirs)
    rng = random.Random(3)
    values = [*BUCKETS, 0.0, 5.0, *(rng.expovariate(1000) for _ in range(500))]  # every bound hit exactly too
    for v in values:
        labels = (rng.choice(["a", "b"]), rng.choice(["search", "stats"]))
        loop.labels(*labels).observe(v)
        reference.labels(*labels).observe(v)
    assert _without_created(generate_latest(ours)) == _without_created(generate_latest(theirs))


def test_labels_are_checked_and_children_kept():
    h = LoopHistogram("u_seconds", "x", BUCKETS, ("shard",), CollectorRegistry())
    assert h.labels("a") is h.labels("a")
    with pytest.raises(ValueError, match="u_seconds"):
        h.labels("a", "b")
