"""The fleet file's autoscaling tables: `[autoscaling]` and a version's `autoscale`.

Both are `ScalingSettings` (the one source of the thresholds, cool-downs, bounds and warm
pool that the Kubernetes driver reads too), made strict like the rest of the fleet file:

    [autoscaling]                 # the defaults of every autoscaled version, and the loop's pace
    interval_s = 0.1
    max_workers = 4
    [autoscaling.warm_pool]
    windows = [{ start = "00:00", size = 1 }]

    [models.m.versions.v1]
    replicas = 1                  # the serving workers at start-up
    autoscale = true              # scaled with [autoscaling]; or a table that overrides it:
    [models.m.versions.v2.autoscale]
    max_workers = 2               # the other fields come from [autoscaling]

A version's table is merged over `[autoscaling]` *before* validation (`merge_version_tables`),
so a bad merged value is reported at the version's own line, and a bad `[autoscaling]` value
at its own. `warm_pool` is replaced whole, never merged field by field: a schedule is one
thing. Autoscaling is off unless a version asks for it; an `[autoscaling]` table that no
version uses is an error (fleet_file/loader.py), not a silent no-op.
"""

from __future__ import annotations

from typing import Any

from pydantic import ConfigDict, Field

from sluice.routing.fleet_file.scaling_settings import ScalingSettings

LOOP_ONLY = ("interval_s",)  # fleet-wide: the one supervisor loop runs at one pace


class VersionAutoscaleSpec(ScalingSettings):
    """A version's scaling settings (the policy's own fields, strictly typed)."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    def policy_settings(self) -> ScalingSettings:
        return ScalingSettings(**{k: v for k, v in self.model_dump().items() if k not in LOOP_ONLY})


class AutoscalingSpec(VersionAutoscaleSpec):
    # how often the local supervisor observes the fleet and acts. Observing is counting a few
    # workers in memory, so it is cheap; it bounds how long a warm worker waits to be promoted
    # after the signal crosses scale_up_at (the goal is < 100 ms: docs/BENCHMARKS.md)
    interval_s: float = Field(0.1, gt=0, le=60)


def merge_version_tables(data: Any) -> Any:
    """The raw fleet document with every version's `autoscale` table merged over
    `[autoscaling]` (leaves anything malformed alone: validation reports it)."""
    if not isinstance(data, dict) or not isinstance(data.get("models"), dict):
        return data
    base = data.get("autoscaling", {})
    if not isinstance(base, dict):
        return data
    inherited = {k: v for k, v in base.items() if k not in LOOP_ONLY}
    for model in data["models"].values():
        versions = model.get("versions") if isinstance(model, dict) else None
        for version in (versions or {}).values() if isinstance(versions, dict) else ():
            if isinstance(version, dict) and isinstance(version.get("autoscale"), dict):
                version["autoscale"] = {**inherited, **version["autoscale"]}
    return data
