"""The autoscaling settings: the ONE source of the thresholds, cool-downs, bounds and warm pool.

Both drivers read this object: the local supervisor (through `ScalingPolicy`) and Kubernetes
(`scaling/keda_scaledobject.py` turns it into the committed KEDA ScaledObject; a test fails when the
committed YAML differs from what these defaults generate). Change a number here, run
`python deploy/generate.py`, and both agree again.

The signal is `sluice_scaling_signal{model}`: Σ estimated tokens (queued + in flight) over the
token capacity of the serving workers (per model: each model's workers scale on their own). It
is a utilisation, so the scale-up threshold is also the target: scaling up asks for
`ceil(serving × signal / scale_up_at)` workers, the number that brings the signal back to the
threshold — exactly the Kubernetes HPA's rule for a `Value` metric, so the two drivers compute
the same counts.
"""

from __future__ import annotations

import math

from pydantic import BaseModel, ConfigDict, Field, model_validator

from sluice.routing.fleet_file.warm_pool_schedule import WarmPoolSchedule, WarmPoolWindow

# one pre-loaded worker at night, two in the (UTC) working day; set your users' timezone
DEFAULT_WARM_POOL = WarmPoolSchedule(
    timezone="UTC",
    windows=(
        WarmPoolWindow(start="00:00", size=1),
        WarmPoolWindow(start="08:00", size=2),
        WarmPoolWindow(start="20:00", size=1),
    ),
)


class ScalingSettings(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    # hysteresis: between the two thresholds nothing changes, so a signal wobbling around one
    # of them cannot flap the fleet (the product spec's 0.7 / 0.2)
    scale_up_at: float = Field(0.7, gt=0)
    scale_down_at: float = Field(0.2, ge=0)
    # after a scale-up, the next one waits this long: the new workers' capacity must show in
    # the signal first. Short, because promoting a warm worker is only a routing change.
    up_cooldown_s: float = Field(15.0, ge=0)
    # the signal must stay below scale_down_at this long before one scale-down step (and again
    # before the next): load that comes back within the window never pays a cold start.
    # 300 s is the Kubernetes HPA's default scale-down stabilization and KEDA's cooldownPeriod.
    down_cooldown_s: float = Field(300.0, ge=0)
    max_step_up: int = Field(4, ge=1)  # workers added per scale-up
    max_step_down: int = Field(1, ge=1)  # workers drained per scale-down step
    min_serving: int = Field(1, ge=1)  # workers taking traffic, whatever the signal
    max_workers: int = Field(8, ge=1)  # every worker (serving + warm + starting): the hardware
    warm_pool: WarmPoolSchedule = DEFAULT_WARM_POOL
    # a scale-up that only batch-band work needs starts cold workers and leaves the warm pool to
    # latency-sensitive bursts (batch requests wait in the queue for the cold start)
    batch_waits_for_cold: bool = True

    @model_validator(mode="after")
    def _consistent(self) -> ScalingSettings:
        if self.scale_down_at >= self.scale_up_at:
            raise ValueError(f"scale_down_at ({self.scale_down_at}) must be below scale_up_at ({self.scale_up_at})")
        if self.min_serving > self.max_workers:
            raise ValueError(f"min_serving ({self.min_serving}) exceeds max_workers ({self.max_workers})")
        return self

    def workers_for(self, serving: int, signal: float) -> int:
        """Workers that carry the observed load at the target utilisation (the HPA's formula)."""
        if math.isinf(signal):
            return serving + self.max_step_up
        return math.ceil(serving * signal / self.scale_up_at - 1e-9)  # 1e-9: 3×0.7/0.7 is 3, not 4

    @property
    def scale_down_tolerance(self) -> float:
        """The HPA's scale-down tolerance that puts its scale-down point at scale_down_at.

        The HPA leaves replicas alone while |signal/target − 1| ≤ tolerance; with the target at
        scale_up_at, scale-down starts below target × (1 − tolerance) = scale_down_at."""
        return 1.0 - self.scale_down_at / self.scale_up_at
