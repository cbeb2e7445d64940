"""What a version's local replica is started with: `sluice worker`'s model, dtype and engine flags.

One function for both callers, so they agree to the byte: LocalReplicas starting a replica, and
`sluice serve` prestarting its worker before the gateway's imports (worker/spawn.py), whose child
the first start adopts only when these arguments are exactly the same.

Threads: a worker's torch (OpenMP) team defaults to one thread per core. Two such workers on
the same cores spin at each other's barriers — on 2 cores a worker beside another ran many
times slower than alone (docs/BENCHMARKS.md). So unless the version sets `threads`, each local
replica gets an equal share of the cores this process may use: cores // local replicas, at
least 1. A gateway with one local worker leaves torch's default (nothing changes).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from sluice.config import Settings
from sluice.engine.config import EngineConfig
from sluice.routing.fleet_file.schema import BUNDLED, FleetSpec, VersionSpec
from sluice.worker.spawn import engine_argv


@dataclass(frozen=True, slots=True)
class ReplicaLaunch:
    model: str | None  # None: the bundled model
    dtype: str
    engine_args: tuple[str, ...]


def available_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def local_replica_count(fleet: FleetSpec) -> int:
    """The local workers the fleet file starts with (every version's `replicas`). A rollout or
    an autoscaler may run more for a while; the share is fixed at start-up."""
    return max(1, sum(v.replicas for m in fleet.models.values() for v in m.versions.values()))


def auto_threads(local_replicas: int, cores: int | None = None) -> int:
    """0 (torch's default) for one worker; else an equal share of the cores, at least 1."""
    if local_replicas <= 1:
        return 0
    return max(1, (cores if cores is not None else available_cores()) // local_replicas)


def replica_launch(settings: Settings, spec: VersionSpec, local_replicas: int = 1) -> ReplicaLaunch:
    config = spec.engine.apply(EngineConfig.from_settings(settings))
    if config.threads == 0:
        config.threads = auto_threads(local_replicas)
    return ReplicaLaunch(
        None if spec.weights == BUNDLED else spec.weights,
        spec.dtype or settings.dtype,
        tuple(engine_argv(config, spec.fault_injection)),
    )
