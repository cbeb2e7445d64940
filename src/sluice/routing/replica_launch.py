"""What a version's local replica is started with: `sluice worker`'s model, dtype and engine flags.

One function for both callers, so they agree to the byte: LocalReplicas starting a replica, and
`sluice serve` prestarting its worker before the gateway's imports (worker/spawn.py), whose child
the first start adopts only when these arguments are exactly the same.
"""

from __future__ import annotations

from dataclasses import dataclass

from sluice.config import Settings
from sluice.engine.config import EngineConfig
from sluice.routing.fleet_schema import BUNDLED, VersionSpec
from sluice.worker.spawn import engine_argv


@dataclass(frozen=True, slots=True)
class ReplicaLaunch:
    model: str | None  # None: the bundled model
    dtype: str
    engine_args: tuple[str, ...]


def replica_launch(settings: Settings, spec: VersionSpec) -> ReplicaLaunch:
    config = spec.engine.apply(EngineConfig.from_settings(settings))
    return ReplicaLaunch(None if spec.weights == BUNDLED else spec.weights, spec.dtype or settings.dtype,
                         tuple(engine_argv(config, spec.fault_injection)))
