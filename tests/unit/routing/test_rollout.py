"""The rollout state machine: warm, shift in steps, watch, roll back by itself, drain."""

from __future__ import annotations

import pytest

from sluice.routing.dispatch.version_router import choose_version, sticky_key
from sluice.routing.errors import RolloutError
from sluice.routing.fleet_file.schema import RolloutSpec
from sluice.routing.state.rollout import Rollout, RolloutPhase, RolloutSignals
from sluice.routing.state.rollout_health import HealthWindow, p95
from sluice.routing.state.routing_state import VersionState

PLAN = RolloutSpec(
    steps=[10, 25, 50, 100],
    step_interval_s=60,
    max_error_rate=0.05,
    max_ttft_p95_s=2.0,
    min_requests=20,
    warm_timeout_s=300,
    drain_timeout_s=120,
)
WARM = RolloutSignals(target_warm=True)
T0 = 5000.0


def start(weights=None, plan=PLAN) -> Rollout:
    return Rollout.start("m", "v2", weights or {"v1": 100, "v2": 0}, plan, T0)


def healthy_traffic(r: Rollout, t0: float, t1: float, n: int = 40) -> None:
    for i in range(n):
        r.observe(t0 + (t1 - t0) * i / n, ok=True, ttft_s=0.2)


def test_happy_path_warm_shift_drain_done():
    r = start()
    assert r.phase is RolloutPhase.WARMING and r.weights() == {"v1": 100, "v2": 0}
    assert r.version_states() == {"v1": VersionState.ACTIVE, "v2": VersionState.WARMING}
    assert not r.tick(T0 + 30, RolloutSignals(target_warm=False))  # nothing moves until warm
    assert r.tick(T0 + 40, WARM)
    assert (r.phase, r.weights()) == (RolloutPhase.SHIFTING, {"v1": 90, "v2": 10})
    seen = []
    t = T0 + 40
    while r.phase is RolloutPhase.SHIFTING:
        healthy_traffic(r, t, t + 59)
        assert not r.tick(t + 59.9, WARM)  # a step is held for step_interval_s
        t += 60
        assert r.tick(t, WARM)
        seen.append(r.weights()["v2"])
    assert seen == [25, 50, 100] and r.phase is RolloutPhase.DRAINING
    assert r.version_states() == {"v1": VersionState.DRAINING, "v2": VersionState.ACTIVE}
    busy = RolloutSignals(target_warm=True, sources_inflight=3)
    assert not r.tick(t + 60, busy)  # held, but v1 still finishes three requests
    assert r.tick(t + 61, RolloutSignals(target_warm=True, sources_inflight=0))
    assert r.phase is RolloutPhase.DONE and r.reason == "drained" and r.phase.finished
    assert r.version_states() == {"v1": VersionState.RETIRED, "v2": VersionState.ACTIVE}
    assert r.weights() == {"v1": 0, "v2": 100}


def test_drain_timeout_finishes_anyway():
    r = start(plan=PLAN.model_copy(update={"steps": [100.0]}))
    r.tick(T0, WARM)
    assert r.phase is RolloutPhase.DRAINING
    stuck = RolloutSignals(target_warm=True, sources_inflight=1)
    assert not r.tick(T0 + 119, stuck)
    assert r.tick(T0 + 120, stuck)
    assert r.phase is RolloutPhase.DONE and "timed out with 1 requests" in r.reason


def test_sources_keep_their_proportions_and_users_only_move_into_the_target():
    r = start({"a": 60, "b": 40, "v2": 0})
    r.tick(T0, WARM)
    assert r.weights() == pytest.approx({"a": 54, "b": 36, "v2": 10})
    keys = [sticky_key("t", user_id=f"u{i}") for i in range(3000)]
    prev = {k: choose_version("m", r.weights(), k) for k in keys}
    t = T0
    while r.phase is RolloutPhase.SHIFTING:
        healthy_traffic(r, t, t + 59)
        t += 60
        r.tick(t, WARM)
        cur = {k: choose_version("m", r.weights(), k) for k in keys}
        assert all(cur[k] == "v2" for k in keys if prev[k] == "v2")  # nobody leaves the new version
        assert all(cur[k] in (prev[k], "v2") for k in keys)  # and nobody swaps between old ones
        prev = cur


def test_an_error_rate_breach_rolls_back_by_itself():
    r = start()
    r.tick(T0, WARM)
    r.tick(T0 + 60, WARM)  # 25 %
    for i in range(19):
        assert not r.observe(T0 + 61 + i, ok=(i % 3 != 0))  # bad, but under min_requests
    assert r.observe(T0 + 80, ok=False)  # the 20th: 8 of 20 failed
    assert r.phase is RolloutPhase.ROLLING_BACK and "error rate 0.40 > 0.05 over 20 requests" in r.reason
    assert r.weights() == {"v1": 100, "v2": 0}  # the old weights, at once
    assert r.version_states() == {"v1": VersionState.ACTIVE, "v2": VersionState.DRAINING}
    assert not r.tick(T0 + 81, RolloutSignals(target_inflight=2))  # v2 finishes what it has
    assert r.tick(T0 + 82, RolloutSignals(target_inflight=0))
    assert r.phase is RolloutPhase.ROLLED_BACK and r.version_states()["v2"] is VersionState.RETIRED
    assert not r.observe(T0 + 83, ok=False) and r.phase is RolloutPhase.ROLLED_BACK


def test_a_ttft_breach_rolls_back_and_so_does_a_breach_seen_on_tick():
    r = start()
    r.tick(T0, WARM)
    for i in range(30):
        r.observe(T0 + i, ok=True, ttft_s=3.0 if i % 10 == 0 else 0.5)  # p95 = 3.0 s
    assert r.phase is RolloutPhase.ROLLING_BACK and "TTFT p95 3.000 s > 2.000 s" in r.reason
    # while draining the old version the target is still watched
    r = start(plan=PLAN.model_copy(update={"steps": [100.0]}))
    r.tick(T0, WARM)
    assert r.phase is RolloutPhase.DRAINING
    for i in range(25):
        r.health.observe(T0 + i, ok=False)  # observations arriving through another path
    assert r.tick(T0 + 30, WARM) and r.phase is RolloutPhase.ROLLING_BACK


def test_rollback_restores_an_existing_canary_minus_the_target():
    r = start({"v1": 80, "v2": 10, "v3": 10})
    assert r.steps == [25, 50]  # 10 % is already there: skipped
    r.tick(T0, WARM)
    assert r.weights() == pytest.approx({"v1": 75 * 8 / 9, "v2": 25, "v3": 75 / 9})
    r.abort(T0 + 5)
    assert r.phase is RolloutPhase.ROLLING_BACK and r.reason == "rolled back by the operator"
    assert r.weights() == {"v1": 80, "v2": 0, "v3": 10}


def test_not_warm_in_time_rolls_back_without_shifting():
    r = start()
    assert not r.tick(T0 + 299, RolloutSignals(target_warm=False))
    assert r.tick(T0 + 300, RolloutSignals(target_warm=False))
    assert r.phase is RolloutPhase.ROLLING_BACK and "not warm after 300 s" in r.reason
    assert r.weights() == {"v1": 100, "v2": 0}


def test_start_refuses_what_cannot_roll_out():
    with pytest.raises(RolloutError, match="no version 'v9'"):
        Rollout.start("m", "v9", {"v1": 100}, PLAN, T0)
    with pytest.raises(RolloutError, match="already carries all"):
        Rollout.start("m", "v1", {"v1": 100, "v2": 0}, PLAN, T0)


def test_the_shared_form_round_trips_and_continues_identically():
    r = start()
    r.tick(T0, WARM)
    r.tick(T0 + 60, WARM)
    copy = Rollout.from_dict(r.to_dict())
    assert copy == r and copy.weights() == r.weights() and copy.version_states() == r.version_states()
    for x in (r, copy):
        healthy_traffic(x, T0 + 60, T0 + 119)
        x.tick(T0 + 120, WARM)
    assert copy.to_dict() == r.to_dict() and copy.weights()["v2"] == 50


def test_health_window():
    assert p95([]) is None and p95([1.0]) == 1.0 and p95([float(i) for i in range(1, 101)]) == 95.0
    w = HealthWindow(window_s=10, min_requests=3, max_error_rate=0.5, max_ttft_p95_s=1.0)
    w.observe(0, False)
    w.observe(1, False)
    assert w.verdict(1) is None  # two outcomes: not enough to judge
    w.observe(2, True, 0.1)
    assert w.verdict(2) is not None  # 2 of 3 failed
    assert w.verdict(11.5) is None  # the failures aged out of the window
    assert w.snapshot(11.5).requests == 1
