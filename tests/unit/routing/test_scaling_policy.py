"""The autoscaling policy on a fake clock: bursts, cool-downs, hysteresis, bounds, the warm pool.

Every test drives `ScalingPolicy.decide` with observations and moves the injected clock; no test
sleeps. `_Fleet` plays a driver: it applies each decision's actions (promotion instant, starts
ready after a delay), with a fixed demand so the signal answers the capacity the policy adds.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime

import pytest
from pydantic import ValidationError

from sluice.routing.fleet_file.scaling_settings import ScalingSettings
from sluice.routing.fleet_file.warm_pool_schedule import WarmPoolSchedule, WarmPoolWindow
from sluice.routing.scaling.decision import FleetObservation, ScaleReason, ScalingActions
from sluice.routing.scaling.policy import ScalingPolicy
from tests.clock import FakeClock

NOON_UTC = datetime(2026, 6, 15, 12, 0, tzinfo=UTC)


ONE_WARM = WarmPoolSchedule(windows=(WarmPoolWindow(start="00:00", size=1),))


def _policy(clock: FakeClock, initial: int | None = None, **kw) -> ScalingPolicy:
    kw.setdefault("warm_pool", ONE_WARM)  # a constant pool unless a test is about the schedule
    return ScalingPolicy(ScalingSettings(**kw), clock, initial_serving=initial)


@dataclass
class _Fleet:
    """A driver with instant promotion, starts ready after `start_s`, drains done at once."""

    policy: ScalingPolicy
    clock: FakeClock
    demand: float  # tokens wanted, in units of one worker's capacity
    serving: int = 1
    warm: int = 1
    start_s: float = 5.0
    pending: list[float] = field(default_factory=list)  # ready times of starting workers
    changes: list[tuple[float, ScaleReason, int]] = field(default_factory=list)

    def tick(self, batch_demand: float = 0.0):
        ready = [t for t in self.pending if t <= self.clock.t]
        self.pending = [t for t in self.pending if t > self.clock.t]
        self.warm += len(ready)
        obs = FleetObservation(
            self.demand / self.serving, self.serving, self.warm, len(self.pending), 0, batch_demand / self.serving
        )
        d = self.policy.decide(obs)
        a = d.actions
        self.serving += a.promote - a.drain_to_warm - a.drain_and_stop
        self.warm += a.drain_to_warm - a.promote - a.retire_warm
        self.pending += [self.clock.t + self.start_s] * a.start
        if d.reason in (ScaleReason.SCALE_UP, ScaleReason.SCALE_DOWN):
            self.changes.append((self.clock.t, d.reason, d.desired_serving))
        return d


# -- scale up ---------------------------------------------------------------------------------
def test_burst_promotes_a_warm_worker_and_starts_a_replacement():
    clock = FakeClock(wall=NOON_UTC)
    policy = _policy(clock)
    d = policy.decide(FleetObservation(signal=0.9, serving=1, warm=1))
    assert d.reason is ScaleReason.SCALE_UP
    assert (d.desired_serving, d.desired_warm) == (2, 1)
    assert d.actions == ScalingActions(promote=1, start=1)  # the pool refills in the background
    assert not d.batch_waits_for_cold
    # next tick: the promoted worker serves, the replacement is starting: nothing more to do
    d = policy.decide(FleetObservation(signal=0.45, serving=2, warm=0, starting=1))
    assert d.reason is ScaleReason.STEADY and d.actions.none


def test_scale_up_asks_for_the_hpa_count_within_the_step_limit():
    clock = FakeClock(wall=NOON_UTC)
    # 2 serving at signal 1.4: the load of 2.8 workers → ceil(2 × 1.4 / 0.7) = 4 at the target
    d = _policy(clock, initial=2).decide(FleetObservation(signal=1.4, serving=2, warm=3))
    assert d.desired_serving == 4 and d.actions.promote == 2
    # a huge signal adds at most max_step_up per scale-up
    d = _policy(clock, initial=2, max_step_up=2, max_workers=20).decide(FleetObservation(signal=9.0, serving=2, warm=1))
    assert d.desired_serving == 4
    # exactly at the threshold is inside the band (the HPA also leaves a ratio of 1 alone)
    d = _policy(clock, initial=3).decide(FleetObservation(signal=0.7, serving=3, warm=1))
    assert d.reason is ScaleReason.STEADY and d.desired_serving == 3


def test_no_second_scale_up_within_the_up_cooldown():
    clock = FakeClock(wall=NOON_UTC)
    policy = _policy(clock, up_cooldown_s=15.0)
    assert policy.decide(FleetObservation(0.9, 1, 1)).reason is ScaleReason.SCALE_UP
    clock.advance(14.9)
    d = policy.decide(FleetObservation(0.9, 2, 0, starting=1))  # still hot: load rose again
    assert d.reason is ScaleReason.UP_COOLDOWN and d.desired_serving == 2 and d.actions.promote == 0
    clock.advance(0.1)
    d = policy.decide(FleetObservation(0.9, 2, 1))
    assert d.reason is ScaleReason.SCALE_UP and d.desired_serving == 3 and d.actions.promote == 1


# -- scale down -------------------------------------------------------------------------------
def test_load_gone_scales_down_only_after_the_cooldown():
    clock = FakeClock(wall=NOON_UTC)
    policy = _policy(clock, initial=3, down_cooldown_s=300.0)
    for _ in range(299):
        d = policy.decide(FleetObservation(0.05, 3, 1))
        assert d.reason is ScaleReason.DOWN_PENDING and d.actions.none
        clock.advance(1.0)
    d = policy.decide(FleetObservation(0.05, 3, 1))  # 299 s: one second short
    assert d.reason is ScaleReason.DOWN_PENDING
    clock.advance(1.0)
    d = policy.decide(FleetObservation(0.05, 3, 1))
    assert d.reason is ScaleReason.SCALE_DOWN and d.desired_serving == 2
    assert d.actions == ScalingActions(drain_and_stop=1)  # the pool is full: stop it after the drain
    # the window restarts: the next step needs another full low window
    clock.advance(299.0)
    assert policy.decide(FleetObservation(0.05, 2, 1)).reason is ScaleReason.DOWN_PENDING
    clock.advance(1.0)
    assert policy.decide(FleetObservation(0.05, 2, 1)).desired_serving == 1
    clock.advance(300.0)
    d = policy.decide(FleetObservation(0.0, 1, 1))
    assert d.reason is ScaleReason.AT_MIN and d.desired_serving == 1 and d.actions.none


def test_a_drained_worker_refills_a_short_warm_pool_instead_of_stopping():
    clock = FakeClock(wall=NOON_UTC)
    policy = _policy(clock, initial=2, down_cooldown_s=0.0)
    d = policy.decide(FleetObservation(0.05, 2, warm=0))
    assert d.reason is ScaleReason.SCALE_DOWN
    assert d.actions == ScalingActions(drain_to_warm=1)  # its model stays loaded: no cold start


def test_load_back_within_the_window_never_scales_down():
    clock = FakeClock(wall=NOON_UTC)
    policy = _policy(clock, initial=2, down_cooldown_s=60.0)
    for step in range(600):  # ten minutes of a signal that is low except once every 50 s
        signal = 0.3 if step % 50 == 49 else 0.1
        d = policy.decide(FleetObservation(signal, 2, 1))
        assert d.desired_serving == 2 and d.reason in (ScaleReason.DOWN_PENDING, ScaleReason.STEADY)
        clock.advance(1.0)


# -- hysteresis -------------------------------------------------------------------------------
def test_no_flapping_with_demand_around_the_scale_up_threshold():
    """Demand wobbling around 0.7 of two workers: one scale-up, then calm, no scale-down."""
    clock = FakeClock(wall=NOON_UTC)
    fleet = _Fleet(_policy(clock, initial=2, down_cooldown_s=60.0), clock, demand=1.4, serving=2)
    for step in range(1200):  # 20 minutes, one tick a second
        fleet.demand = 1.38 if step % 2 else 1.42
        fleet.tick()
        clock.advance(1.0)
    assert [(r, n) for _, r, n in fleet.changes] == [(ScaleReason.SCALE_UP, 3)]
    assert fleet.serving == 3 and fleet.warm == 1


def test_no_flapping_with_a_signal_wobbling_around_the_scale_down_threshold():
    clock = FakeClock(wall=NOON_UTC)
    policy = _policy(clock, initial=3, down_cooldown_s=30.0)
    for step in range(900):
        d = policy.decide(FleetObservation(0.19 if step % 2 else 0.21, 3, 1))
        assert d.desired_serving == 3 and d.actions.none
        clock.advance(1.0)


def test_a_burst_then_quiet_scales_up_once_and_down_after_the_window():
    clock = FakeClock(wall=NOON_UTC)
    fleet = _Fleet(_policy(clock, down_cooldown_s=120.0), clock, demand=0.2)
    for step in range(600):
        fleet.demand = 2.5 if 10 <= step < 100 else 0.1
        fleet.tick()
        clock.advance(1.0)
    ups = [t for t, r, _ in fleet.changes if r is ScaleReason.SCALE_UP]
    downs = [t for t, r, _ in fleet.changes if r is ScaleReason.SCALE_DOWN]
    assert ups and downs and max(ups) < min(downs)  # never down while the burst lasts
    assert min(downs) - 1000.0 >= 100 + 120  # the first step down waits a full window after the burst
    assert fleet.serving == 1 and fleet.warm == 1 and not fleet.pending


# -- bounds -----------------------------------------------------------------------------------
def test_max_workers_caps_serving_and_the_warm_pool_gives_way():
    clock = FakeClock(wall=NOON_UTC)
    fleet = _Fleet(_policy(clock, max_workers=4, up_cooldown_s=0.0), clock, demand=10.0, start_s=0.0)
    reasons = set()
    for _ in range(20):
        reasons.add(fleet.tick().reason)
        assert fleet.serving + fleet.warm + len(fleet.pending) <= 4
        clock.advance(1.0)
    d = fleet.tick()
    assert d.reason is ScaleReason.AT_MAX and d.desired_serving == 4 and d.desired_warm == 0
    assert fleet.serving == 4 and fleet.warm == 0


def test_min_serving_is_kept_and_settings_reject_inconsistent_bounds():
    clock = FakeClock(wall=NOON_UTC)
    policy = _policy(clock, initial=1, min_serving=2, down_cooldown_s=0.0)
    assert policy.desired_serving == 2  # initial below the minimum is raised to it
    d = policy.decide(FleetObservation(0.0, 2, 1))
    assert d.desired_serving == 2 and d.reason is ScaleReason.AT_MIN
    with pytest.raises(ValidationError, match="scale_down_at"):
        ScalingSettings(scale_up_at=0.5, scale_down_at=0.5)
    with pytest.raises(ValidationError, match="min_serving"):
        ScalingSettings(min_serving=5, max_workers=4)


# -- failures ---------------------------------------------------------------------------------
def test_a_dead_serving_worker_is_replaced_from_the_pool_without_a_cooldown():
    clock = FakeClock(wall=NOON_UTC)
    policy = _policy(clock, initial=3)
    assert policy.decide(FleetObservation(0.9, 3, 1)).reason is ScaleReason.SCALE_UP  # starts the up cool-down
    d = policy.decide(FleetObservation(0.5, 3, 0, starting=1))
    d = policy.decide(FleetObservation(0.6, 2, 0, starting=1))  # one died: 2 of the wanted 4 left
    assert d.reason is ScaleReason.REPLACE and d.desired_serving == 4
    assert d.actions.start == 2  # nothing warm yet: two cold, one of them refills the pool later
    d = policy.decide(FleetObservation(0.6, 2, 1, starting=2))
    assert d.actions == ScalingActions(promote=1, start=0)  # the ready one serves at once
    d = policy.decide(FleetObservation(float("inf"), 0, 1))  # every serving worker gone
    assert d.reason is ScaleReason.REPLACE and d.actions.promote == 1


# -- batch work -------------------------------------------------------------------------------
def test_batch_only_demand_waits_for_a_cold_start_and_keeps_the_pool():
    clock = FakeClock(wall=NOON_UTC)
    policy = _policy(clock)
    # signal 0.9, of which batch 0.5: latency-sensitive work alone (0.4) does not need more
    d = policy.decide(FleetObservation(0.9, 1, 1, batch_signal=0.5))
    assert d.reason is ScaleReason.SCALE_UP and d.desired_serving == 2
    assert d.actions == ScalingActions(promote=0, start=1) and d.batch_waits_for_cold
    d = policy.decide(FleetObservation(0.9, 1, 1, starting=1, batch_signal=0.5))
    assert d.actions.none and d.batch_waits_for_cold  # no second start for the same slot
    # the cold worker is ready (a surplus warm one): it takes the slot; the pool stays full
    d = policy.decide(FleetObservation(0.9, 1, 2, batch_signal=0.5))
    assert d.actions == ScalingActions(promote=1) and not d.batch_waits_for_cold
    assert policy.decide(FleetObservation(0.45, 2, 1, batch_signal=0.25)).actions.none


def test_batch_slot_uses_the_pool_once_latency_sensitive_load_needs_it():
    clock = FakeClock(wall=NOON_UTC)
    policy = _policy(clock)
    assert policy.decide(FleetObservation(0.9, 1, 1, batch_signal=0.5)).batch_waits_for_cold
    d = policy.decide(FleetObservation(0.9, 1, 1, starting=1, batch_signal=0.1))  # interactive 0.8
    assert d.actions.promote == 1 and not d.batch_waits_for_cold


def test_batch_work_takes_warm_workers_when_the_setting_is_off():
    clock = FakeClock(wall=NOON_UTC)
    d = _policy(clock, batch_waits_for_cold=False).decide(FleetObservation(0.9, 1, 1, batch_signal=0.9))
    assert d.actions == ScalingActions(promote=1, start=1) and not d.batch_waits_for_cold


# -- the warm pool's schedule -----------------------------------------------------------------
BERLIN = WarmPoolSchedule(
    timezone="Europe/Berlin", windows=(WarmPoolWindow(start="08:00", size=3), WarmPoolWindow(start="20:00", size=1))
)


@pytest.mark.parametrize(
    ("utc", "size"),
    [
        (datetime(2026, 1, 15, 6, 59), 1),  # 07:59 Berlin (UTC+1): before the first start → last window
        (datetime(2026, 1, 15, 7, 0), 3),  # 08:00 Berlin: the day window starts on the minute
        (datetime(2026, 1, 15, 18, 59), 3),  # 19:59
        (datetime(2026, 1, 15, 19, 0), 1),  # 20:00
        (datetime(2026, 1, 15, 23, 30), 1),  # past midnight local: still the evening window
        (datetime(2026, 7, 15, 6, 0), 3),  # summer time (UTC+2): 08:00 local is 06:00 UTC
        (datetime(2026, 7, 15, 5, 59), 1),
    ],
)
def test_schedule_boundaries_in_local_time(utc: datetime, size: int):
    assert BERLIN.size_at(utc.replace(tzinfo=UTC)) == size


def test_schedule_across_the_daylight_saving_change():
    # 2026-03-29 Berlin skips 02:00→03:00; the 08:00 window still opens at 08:00 local (06:00 UTC)
    assert BERLIN.size_at(datetime(2026, 3, 29, 5, 59, tzinfo=UTC)) == 1
    assert BERLIN.size_at(datetime(2026, 3, 29, 6, 0, tzinfo=UTC)) == 3


def test_the_default_schedule_keeps_more_warm_workers_in_the_day():
    pool = ScalingSettings().warm_pool
    assert pool.size_at(datetime(2026, 6, 15, 3, 0, tzinfo=UTC)) == 1
    assert pool.size_at(datetime(2026, 6, 15, 12, 0, tzinfo=UTC)) == 2
    assert pool.smallest == 1


def test_schedule_validation():
    with pytest.raises(ValidationError, match="HH:MM"):
        WarmPoolWindow(start="8:00", size=1)
    with pytest.raises(ValidationError, match="HH:MM"):
        WarmPoolWindow(start="24:00", size=1)
    with pytest.raises(ValidationError, match="increasing"):
        WarmPoolSchedule(windows=(WarmPoolWindow(start="09:00", size=1), WarmPoolWindow(start="08:00", size=2)))
    with pytest.raises(ValidationError, match="unknown timezone"):
        WarmPoolSchedule(timezone="Mars/Olympus")
    with pytest.raises(ValueError, match="aware"):
        BERLIN.size_at(datetime(2026, 1, 1, 12, 0))


def test_the_pool_grows_and_shrinks_at_the_schedule_boundaries():
    clock = FakeClock(wall=datetime(2026, 1, 15, 6, 59, tzinfo=UTC))  # 07:59 Berlin
    fleet = _Fleet(_policy(clock, warm_pool=BERLIN), clock, demand=0.3)
    assert fleet.tick().desired_warm == 1 and fleet.warm == 1
    clock.advance(60.0)  # 08:00: the day pool of three
    d = fleet.tick()
    assert d.desired_warm == 3 and d.actions.start == 2
    clock.advance(10.0)
    fleet.tick()
    assert fleet.warm == 3 and fleet.serving == 1
    clock.advance(12 * 3600.0)  # 20:00: back to one; idle warm workers stop without a drain
    d = fleet.tick()
    assert d.desired_warm == 1 and d.actions == ScalingActions(retire_warm=2)
    assert fleet.warm == 1
