"""Which local replicas a gateway should run, from the fleet file and the live routing state.

A pure decision, taken per version on every tick of every gateway (not only on the one that
drives a rollout), so that each gateway starts what its share of the fleet needs and stops what
no one routes to any more:

- RUN: the version takes (or is about to take) traffic — WARMING for a rollout, or ACTIVE
  with a live weight > 0. Missing replicas are started.
- KEEP: the version is DRAINING (finishing its requests), or ACTIVE with weight 0 (staged,
  or turned down by an operator, and cheap to turn up again). What runs keeps running;
  nothing new starts, so a staged version costs nothing until a rollout or weights need it.
- STOP: the version is RETIRED (drained after a rollout, or rolled back). Its replicas drain
  — no new requests, in-flight ones finish — and stop.

Versions no longer in the fleet file (after a reload) are stopped the same way by the caller.
"""

from __future__ import annotations

import enum

from sluice.routing.fleet_file.schema import VersionSpec
from sluice.routing.state.routing_state import VersionState


class ReplicaGoal(str, enum.Enum):
    RUN = "run"
    KEEP = "keep"
    STOP = "stop"


def replica_goal(spec: VersionSpec, state: VersionState, weight: float) -> ReplicaGoal:
    if state is VersionState.RETIRED:
        return ReplicaGoal.STOP
    if spec.replicas > 0 and (state is VersionState.WARMING or (state is VersionState.ACTIVE and weight > 0)):
        return ReplicaGoal.RUN
    return ReplicaGoal.KEEP
