"""The autoscaling policy: one object, two drivers (the local supervisor and Kubernetes).

Pure: it reads a `FleetObservation` and the injected clock, keeps a little state (the serving
count it wants, when it last scaled up, since when the signal has been low) and returns a
`ScalingDecision`. It starts nothing and stops nothing, so every rule is unit-tested on a fake
clock, and the Kubernetes driver (`scaling/keda_scaledobject.py`) carries the same numbers to the HPA.

Rules (numbers from `ScalingSettings`):
- Up: the signal above `scale_up_at` asks for `ceil(serving × signal / scale_up_at)` workers
  (at most `max_step_up` more, at most `max_workers`), then `up_cooldown_s` before the next
  step. The missing workers come from the warm pool first — a routing change — and the pool is
  refilled by starting new workers in the background.
- Down: only after the signal stayed below `scale_down_at` for `down_cooldown_s`, one step of
  at most `max_step_down`, never under `min_serving`; the window restarts after each step.
  Drained workers refill the warm pool before anything is stopped (their model is loaded).
- Between the thresholds nothing changes (hysteresis): no flapping around either one.
- The warm pool's size follows the time-of-day schedule, but gives way to serving workers when
  `max_workers` is reached (under peak load all hardware serves).
- Batch-band work: a scale-up that only batch work needs (the signal is above `scale_up_at`
  but its latency-sensitive part alone is not) is served by cold starts; the pool stays for the
  next interactive burst (`batch_waits_for_cold`). Those slots remember it (`cold_slots`) until
  filled by a started worker, or until latency-sensitive load needs more too.
- A serving worker that died shows as serving < desired: restored at once (`REPLACE`), no
  cool-down — the count the policy wants did not change.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Protocol

from sluice.routing.fleet_file.scaling_settings import ScalingSettings
from sluice.routing.scaling.decision import FleetObservation, ScaleReason, ScalingActions, ScalingDecision


class Clock(Protocol):
    """Two clocks: cool-downs need one that never jumps, the warm-pool schedule a wall clock."""

    def monotonic(self) -> float: ...

    def now(self) -> datetime:
        """An aware datetime (any timezone: the schedule converts to its own)."""
        ...


@dataclass(slots=True, frozen=True)
class SystemClock:
    def monotonic(self) -> float:
        return time.monotonic()

    def now(self) -> datetime:
        return datetime.now(UTC)


class ScalingPolicy:
    def __init__(
        self,
        settings: ScalingSettings | None = None,
        clock: Clock | None = None,
        initial_serving: int | None = None,
    ) -> None:
        self.settings = settings or ScalingSettings()
        self._clock: Clock = clock or SystemClock()
        s = self.settings
        # adopting a running fleet: start from its size, or a first decision would drain it
        self._target = min(s.max_workers, max(s.min_serving, initial_serving or 0))
        self._last_up: float | None = None
        self._below_since: float | None = None
        # serving slots added for batch-only demand and not yet filled: filled by cold starts
        self._cold_slots = 0

    @property
    def desired_serving(self) -> int:
        return self._target

    def decide(self, obs: FleetObservation) -> ScalingDecision:
        s = self.settings
        before = self._target
        reason = self._update_target(obs, self._clock.monotonic())
        if reason is ScaleReason.STEADY and obs.serving < self._target:
            reason = ScaleReason.REPLACE
        if obs.signal - obs.batch_signal > s.scale_up_at or not s.batch_waits_for_cold:
            self._cold_slots = 0  # latency-sensitive work needs workers now: the pool is for it
        elif reason is ScaleReason.SCALE_UP:
            self._cold_slots += self._target - before  # only batch work asked for these
        self._cold_slots = min(self._cold_slots, max(0, self._target - obs.serving))
        desired_warm = min(s.warm_pool.size_at(self._clock.now()), s.max_workers - self._target)
        actions, filled = _plan(obs, self._target, desired_warm, self._cold_slots, s.max_workers)
        self._cold_slots -= filled
        waits = self._cold_slots > 0
        return ScalingDecision(self._target, desired_warm, reason, obs.signal, actions, batch_waits_for_cold=waits)

    # -- the serving count ----------------------------------------------------------------------
    def _update_target(self, obs: FleetObservation, now: float) -> ScaleReason:
        s = self.settings
        if obs.serving == 0:
            # no serving capacity: the signal has no denominator. Restore what is wanted.
            self._below_since = None
            return ScaleReason.REPLACE
        if obs.signal > s.scale_up_at:
            self._below_since = None
            return self._up(obs, now)
        if obs.signal < s.scale_down_at:
            if self._below_since is None:
                self._below_since = now
            return self._down(obs, now)
        self._below_since = None  # back inside the band: a later low must last a full window again
        return ScaleReason.STEADY

    def _up(self, obs: FleetObservation, now: float) -> ScaleReason:
        s = self.settings
        if self._target >= s.max_workers:
            return ScaleReason.AT_MAX
        wanted = max(self._target, s.workers_for(obs.serving, obs.signal))
        new = min(s.max_workers, self._target + s.max_step_up, wanted)
        if new == self._target:
            # the load fits the count already wanted; serving is short of it (a death)
            return ScaleReason.REPLACE if obs.serving < self._target else ScaleReason.STEADY
        if self._last_up is not None and now - self._last_up < s.up_cooldown_s:
            return ScaleReason.UP_COOLDOWN
        self._target, self._last_up = new, now
        return ScaleReason.SCALE_UP

    def _down(self, obs: FleetObservation, now: float) -> ScaleReason:
        s = self.settings
        assert self._below_since is not None
        if now - self._below_since < s.down_cooldown_s:
            return ScaleReason.DOWN_PENDING
        if self._target <= s.min_serving:
            return ScaleReason.AT_MIN
        needed = max(s.min_serving, s.workers_for(obs.serving, obs.signal))
        new = max(needed, self._target - s.max_step_down)
        if new >= self._target:
            return ScaleReason.STEADY
        self._target = new
        self._below_since = now  # one step per window: the next must see a full low window again
        return ScaleReason.SCALE_DOWN


def _plan(
    obs: FleetObservation, target: int, desired_warm: int, cold_slots: int, max_workers: int
) -> tuple[ScalingActions, int]:
    """The steps from `obs` to `target` serving and `desired_warm` warm workers.

    Returns the actions and how many of the `cold_slots` they fill. A cold slot takes only a
    warm worker beyond `desired_warm` (one that a cold start brought in), never the pool."""
    deficit = target - obs.serving
    promote = drain = filled = 0
    if deficit > 0:
        cold = min(deficit, cold_slots)
        promote = min(deficit - cold, obs.warm)  # replacements and latency-driven slots
        filled = min(cold, max(0, obs.warm - promote - desired_warm))
        promote += filled
    elif deficit < 0:
        drain = -deficit
    warm_after = obs.warm - promote
    cold_for_serving = max(0, deficit - promote)  # started now, promoted once ready
    drain_to_warm = min(drain, max(0, desired_warm - warm_after - obs.starting))
    retire = max(0, warm_after - desired_warm)
    # starting workers and drained ones count as coming: never start twice for one gap
    missing = cold_for_serving + desired_warm - warm_after - obs.starting - drain_to_warm
    room = max_workers - obs.total + retire
    start = max(0, min(room, missing))
    actions = ScalingActions(
        promote=promote,
        start=start,
        drain_to_warm=drain_to_warm,
        drain_and_stop=drain - drain_to_warm,
        retire_warm=retire,
    )
    return actions, filled
