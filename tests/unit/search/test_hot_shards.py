from __future__ import annotations

from sluice.search.router.hot_shards import Change, HotShardPolicy, HotShardTracker

POLICY = HotShardPolicy(hot_ratio=2.0, cool_ratio=1.2, hot_for=3, cool_for=4, max_added=1, cooldown=2)


def _run(tracker, loads, times):
    out = []
    for _ in range(times):
        out += tracker.evaluate(loads)
    return out


def test_a_hot_shard_gets_one_replica_after_a_streak_and_loses_it_when_cool():
    t = HotShardTracker(POLICY)
    hot = {"a": 0.010, "b": 0.002, "c": 0.002}
    assert _run(t, hot, 2) == []  # not yet: the streak is 3
    assert _run(t, hot, 1) == [("a", Change.ADD)]
    assert _run(t, hot, 10) == []  # max_added reached
    cool = {"a": 0.002, "b": 0.002, "c": 0.002}
    assert _run(t, cool, 3) == []
    assert _run(t, cool, 1) == [("a", Change.REMOVE)]
    assert _run(t, cool, 10) == []  # configured replicas are never removed
    assert t.added("a") == 0


def test_hysteresis_a_middling_ratio_changes_nothing_and_resets_streaks():
    t = HotShardTracker(POLICY)
    seq = [{"a": 0.010, "b": 0.002, "c": 0.002}] * 2 + [{"a": 0.003, "b": 0.002, "c": 0.002}] + \
          [{"a": 0.010, "b": 0.002, "c": 0.002}] * 2
    assert [c for loads in seq for c in t.evaluate(loads)] == []


def test_too_few_samples_decide_nothing():
    t = HotShardTracker(POLICY)
    assert _run(t, {"a": 0.01, "b": None}, 10) == []
