from __future__ import annotations

from sluice.search.router.config import SearchSettings
from sluice.search.router.replication.hot_shards import Change, HotShardTracker, utilization

POLICY = SearchSettings(hot_at=0.7, cool_at=0.3, hot_for=3, cool_for=4, hot_max_added=1)  # the router's own settings
COOLDOWN = 2


def _run(tracker, loads, times):
    out = []
    for _ in range(times):
        out += tracker.evaluate(loads)
    return out


def test_a_busy_shard_gets_one_replica_after_a_streak_and_loses_it_when_cool():
    t = HotShardTracker(POLICY, COOLDOWN)
    hot = {"a": 0.9, "b": 0.1}
    assert _run(t, hot, 2) == []  # not yet: the streak is 3
    assert _run(t, hot, 1) == [("a", Change.ADD)]
    assert _run(t, hot, 10) == []  # max_added reached
    cool = {"a": 0.2, "b": 0.1}
    assert _run(t, cool, 3) == []
    assert _run(t, cool, 1) == [("a", Change.REMOVE)]
    assert _run(t, cool, 10) == []  # configured replicas are never removed
    assert t.added("a") == 0


def test_hysteresis_a_middling_load_changes_nothing_and_resets_streaks():
    t = HotShardTracker(POLICY, COOLDOWN)
    seq = [{"a": 0.9}] * 2 + [{"a": 0.5}] + [{"a": 0.9}] * 2
    assert [c for loads in seq for c in t.evaluate(loads)] == []


def test_utilization_is_per_serving_replica():
    assert utilization(1.6, 2.0, 1) == 0.8
    assert utilization(1.6, 2.0, 2) == 0.4  # the added replica halves it: no flapping back
    assert utilization(1.0, 2.0, 0) == 0.5
