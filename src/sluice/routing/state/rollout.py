"""`sluice fleet rollout MODEL --to VERSION` as a pure state machine (no I/O, injected time).

    WARMING ──target warm──▶ SHIFTING (step 1 … n, each held step_interval_s) ──▶ DRAINING ──▶ DONE
       │ warm_timeout_s            │ breach / abort                               │ breach / abort
       ▼                           ▼                                              ▼
    ROLLING_BACK (the old weights restored, the target finishing its requests) ──▶ ROLLED_BACK

- WARMING: no traffic moves until every worker of the target is warm (loaded + a warm-up
  generation). Not warm within warm_timeout_s → rolled back (nothing had shifted).
- SHIFTING: the target gets steps[i] % of the model's traffic, the other versions share the
  rest in their old proportions (so sticky users move only *into* the target; see
  dispatch/version_router.py). Steps at or below the target's share when the rollout started are
  skipped. The last step, 100 %, is DRAINING.
- DRAINING: the target has all traffic; the old versions take no new requests and finish
  the ones they have. Held at least step_interval_s (still watching, the old versions still
  up, so a breach can roll back instantly), then DONE once the old versions have nothing
  in flight, or when drain_timeout_s passes.
- While SHIFTING or DRAINING, the health window (state/rollout_health.py) judges the target after
  every observation and tick; a breach, or an operator's `abort`, rolls back: the weights
  the model had before (the target at 0), the target draining its in-flight requests.

The caller feeds `observe` with the target's request outcomes and `tick` with the signals it
sees (RolloutSignals), applies `weights()` and `version_states()` to routing, and stops the
local workers of RETIRED versions. The machine serialises to a dict (to_dict/from_dict) so
the shared routing state carries it and another gateway can follow or take over; the health
window is local to each gateway and not serialised.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from sluice.routing.errors import RolloutError
from sluice.routing.fleet_file.schema import RolloutSpec
from sluice.routing.state.rollout_health import HealthWindow
from sluice.routing.state.routing_state import VersionState


class RolloutPhase(str, enum.Enum):
    WARMING = "warming"
    SHIFTING = "shifting"
    DRAINING = "draining"
    DONE = "done"
    ROLLING_BACK = "rolling_back"
    ROLLED_BACK = "rolled_back"

    @property
    def finished(self) -> bool:
        return self in (RolloutPhase.DONE, RolloutPhase.ROLLED_BACK)


@dataclass(slots=True, frozen=True)
class RolloutSignals:
    target_warm: bool = False  # every worker of the target version is warm
    target_inflight: int = 0  # requests still running on the target
    sources_inflight: int = 0  # requests still running on the versions being replaced


@dataclass(slots=True)
class Rollout:
    model_id: str
    target: str
    start_weights: dict[str, float]  # the model's weights when the rollout began
    plan: RolloutSpec
    started_at: float
    phase: RolloutPhase = RolloutPhase.WARMING
    phase_since: float = 0.0
    step: int = -1  # index into `steps` while SHIFTING
    steps: list[float] = field(default_factory=list)  # the plan's steps below 100 still ahead
    reason: str = ""  # why it rolled back, or how the drain ended
    health: HealthWindow | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.health is None:
            p = self.plan
            self.health = HealthWindow(p.step_interval_s, p.min_requests, p.max_error_rate, p.max_ttft_p95_s)

    # -- construction -------------------------------------------------------------------------
    @classmethod
    def start(cls, model_id: str, target: str, weights: dict[str, float], plan: RolloutSpec, now: float) -> Rollout:
        """Begin rolling `model_id` out to `target`. `weights`: every version's weight now
        (the target included, 0 if it has no traffic yet)."""
        if target not in weights:
            raise RolloutError(f"model {model_id!r} has no version {target!r}")
        total = sum(w for w in weights.values() if w > 0)
        if not any(w > 0 for v, w in weights.items() if v != target):
            raise RolloutError(f"version {target!r} already carries all of {model_id!r}'s traffic")
        share = 100.0 * max(0.0, weights[target]) / total
        steps = [s for s in plan.steps if share < s < 100]
        return cls(model_id, target, dict(weights), plan, now, RolloutPhase.WARMING, now, -1, steps)

    # -- what routing applies -----------------------------------------------------------------
    @property
    def sources(self) -> list[str]:
        """The versions being replaced: those that carried traffic when the rollout began."""
        return [v for v, w in self.start_weights.items() if v != self.target and w > 0]

    def target_percent(self) -> float:
        if self.phase is RolloutPhase.SHIFTING:
            return self.steps[self.step]
        if self.phase in (RolloutPhase.DRAINING, RolloutPhase.DONE):
            return 100.0
        if self.phase is RolloutPhase.WARMING:
            total = sum(w for w in self.start_weights.values() if w > 0)
            return 100.0 * max(0.0, self.start_weights[self.target]) / total
        return 0.0

    def weights(self) -> dict[str, float]:
        """Traffic weights (percent) per version now."""
        if self.phase is RolloutPhase.WARMING:
            return dict(self.start_weights)
        out = {v: 0.0 for v in self.start_weights}
        if self.phase in (RolloutPhase.ROLLING_BACK, RolloutPhase.ROLLED_BACK):
            out.update({v: self.start_weights[v] for v in self.sources})
            return out
        p = self.target_percent()
        src_total = sum(self.start_weights[v] for v in self.sources)
        for v in self.sources:
            out[v] = (100.0 - p) * self.start_weights[v] / src_total
        out[self.target] = p
        return out

    def version_states(self) -> dict[str, VersionState]:
        """The states of the target and the source versions (others are not touched)."""
        src, tgt = VersionState.ACTIVE, VersionState.ACTIVE
        if self.phase is RolloutPhase.WARMING:
            tgt = VersionState.WARMING
        elif self.phase is RolloutPhase.DRAINING:
            src = VersionState.DRAINING
        elif self.phase is RolloutPhase.DONE:
            src = VersionState.RETIRED
        elif self.phase is RolloutPhase.ROLLING_BACK:
            tgt = VersionState.DRAINING
        elif self.phase is RolloutPhase.ROLLED_BACK:
            tgt = VersionState.RETIRED
        return {**{v: src for v in self.sources}, self.target: tgt}

    # -- inputs -------------------------------------------------------------------------------
    def observe(self, now: float, ok: bool, ttft_s: float | None = None) -> bool:
        """One finished request on the target. True when it made the rollout roll back."""
        if self.phase not in (RolloutPhase.SHIFTING, RolloutPhase.DRAINING):
            return False
        assert self.health is not None
        self.health.observe(now, ok, ttft_s)
        return self._judge(now)

    def abort(self, now: float, reason: str = "rolled back by the operator") -> None:
        if not self.phase.finished and self.phase is not RolloutPhase.ROLLING_BACK:
            self._enter(RolloutPhase.ROLLING_BACK, now, reason)

    def tick(self, now: float, signals: RolloutSignals) -> bool:
        """Advance by time and signals; True when the phase or step changed."""
        before = (self.phase, self.step)
        p = self.plan
        if self.phase is RolloutPhase.WARMING:
            if signals.target_warm:
                self._next_step(now)
            elif now - self.started_at >= p.warm_timeout_s:
                self._enter(RolloutPhase.ROLLING_BACK, now, f"{self.target} not warm after {p.warm_timeout_s:g} s")
        elif self.phase in (RolloutPhase.SHIFTING, RolloutPhase.DRAINING):
            if not self._judge(now):  # a breach rolls back before time moves anything forward
                self._advance(now, signals)
        elif self.phase is RolloutPhase.ROLLING_BACK:
            if signals.target_inflight == 0 or now - self.phase_since >= p.drain_timeout_s:
                self._enter(RolloutPhase.ROLLED_BACK, now, self.reason)
        return (self.phase, self.step) != before

    # -- transitions --------------------------------------------------------------------------
    def _advance(self, now: float, signals: RolloutSignals) -> None:
        p = self.plan
        elapsed = now - self.phase_since
        if self.phase is RolloutPhase.SHIFTING:
            if elapsed >= p.step_interval_s:
                self._next_step(now)
        elif elapsed >= p.step_interval_s and signals.sources_inflight == 0:
            self._enter(RolloutPhase.DONE, now, "drained")
        elif elapsed >= max(p.step_interval_s, p.drain_timeout_s):
            self._enter(RolloutPhase.DONE, now, f"drain timed out with {signals.sources_inflight} requests running")

    def _judge(self, now: float) -> bool:
        assert self.health is not None
        breach = self.health.verdict(now)
        if breach is None:
            return False
        self._enter(RolloutPhase.ROLLING_BACK, now, f"{self.target}: {breach.reason}")
        return True

    def _next_step(self, now: float) -> None:
        if self.step + 1 < len(self.steps):
            self.step += 1
            self._enter(RolloutPhase.SHIFTING, now, "")
        else:
            self._enter(RolloutPhase.DRAINING, now, "")

    def _enter(self, phase: RolloutPhase, now: float, reason: str) -> None:
        self.phase, self.phase_since, self.reason = phase, now, reason

    # -- the shared form ----------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {
            "model_id": self.model_id,
            "target": self.target,
            "start_weights": self.start_weights,
            "plan": self.plan.model_dump(),
            "started_at": self.started_at,
            "phase": self.phase.value,
            "phase_since": self.phase_since,
            "step": self.step,
            "steps": self.steps,
            "reason": self.reason,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Rollout:
        return cls(
            d["model_id"],
            d["target"],
            {k: float(v) for k, v in d["start_weights"].items()},
            RolloutSpec.model_validate(d["plan"]),
            float(d["started_at"]),
            RolloutPhase(d["phase"]),
            float(d["phase_since"]),
            int(d["step"]),
            [float(s) for s in d["steps"]],
            d["reason"],
        )
