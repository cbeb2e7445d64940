"""What the scaling policy reads and what it returns: plain data, so drivers can change alone.

The policy never touches a process or a pod. It reads a `FleetObservation` (the signal and how
many workers are in each state) and returns a `ScalingDecision`: the counts it wants, why, and
the concrete `ScalingActions` that get from what is to what it wants. The local supervisor
executes the actions; the Kubernetes driver needs only the counts (the HPA owns the rest).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum


class ScaleReason(StrEnum):
    STEADY = "steady"  # the signal is between the thresholds
    SCALE_UP = "scale_up"  # above scale_up_at: more serving workers
    UP_COOLDOWN = "up_cooldown"  # above, but a scale-up happened less than up_cooldown_s ago
    AT_MAX = "at_max"  # above, but every allowed worker already serves
    DOWN_PENDING = "down_pending"  # below scale_down_at, not yet for down_cooldown_s
    SCALE_DOWN = "scale_down"  # below for down_cooldown_s: one step fewer
    AT_MIN = "at_min"  # below, but already at min_serving
    REPLACE = "replace"  # fewer serving than wanted (a worker died): restore the count


@dataclass(slots=True, frozen=True)
class FleetObservation:
    """The fleet as the driver sees it now.

    `signal` is `sluice_scaling_signal{model}`'s measure (Σ estimated tokens queued + in flight /
    the serving workers' token capacity), for the version or model being scaled; `batch_signal`
    is the part of it owned by batch-band work.
    `warm` workers are loaded and warmed up but take no traffic; `starting` ones are processes
    or pods not ready yet (they join the warm pool when ready); `draining` ones finish their
    in-flight requests and take no new ones.
    """

    signal: float
    serving: int
    warm: int = 0
    starting: int = 0
    draining: int = 0
    batch_signal: float = 0.0

    def __post_init__(self) -> None:
        if min(self.serving, self.warm, self.starting, self.draining) < 0:
            raise ValueError(f"worker counts cannot be negative: {self}")
        if self.signal < 0 or self.batch_signal < 0:
            raise ValueError(f"signals cannot be negative: {self}")

    @property
    def total(self) -> int:
        """Every worker holding hardware (a draining one still does)."""
        return self.serving + self.warm + self.starting + self.draining


@dataclass(slots=True, frozen=True)
class ScalingActions:
    """The steps from the observed fleet to the decided one, in the order a driver runs them."""

    promote: int = 0  # warm → serving: a routing change, instant
    start: int = 0  # new worker processes; they join the warm pool when ready
    drain_to_warm: int = 0  # serving → draining → warm: the model stays loaded
    drain_and_stop: int = 0  # serving → draining → stopped
    retire_warm: int = 0  # warm → stopped (the schedule shrank the pool): no traffic to drain

    @property
    def none(self) -> bool:
        return not (self.promote or self.start or self.drain_to_warm or self.drain_and_stop or self.retire_warm)


@dataclass(slots=True, frozen=True)
class ScalingDecision:
    desired_serving: int
    desired_warm: int
    reason: ScaleReason
    signal: float
    actions: ScalingActions = field(default_factory=ScalingActions)
    # True when serving workers are missing and the warm pool was kept back because only
    # batch-band work needs them: that work waits for the cold start (`actions.start`)
    batch_waits_for_cold: bool = False
