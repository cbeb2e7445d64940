"""The local driver of the scaling policy: a supervisor loop in `sluice serve` that starts,
promotes, drains and stops the local replicas of every autoscaled version.

Every `[autoscaling] interval_s` (0.1 s by default) it observes each autoscaled version
(scaling/observation.py), asks that version's `ScalingPolicy` (the same object and numbers
the Kubernetes driver renders) and runs the actions, in the order the policy lists them:

- promote: a STANDBY worker (loaded, warmed up, taking no traffic) becomes WARM — a status
  change in the worker pool, so the next routing decision can pick it: no model load, no RPC;
- start: a new `sluice worker` in the background; once loaded and warmed up it joins the warm
  pool as STANDBY (and is promoted on a later tick if serving workers are still missing);
- drain_to_warm: a serving worker takes no new requests, its in-flight ones finish, then it
  waits in the warm pool with its model loaded;
- drain_and_stop: the same drain, then the process stops (fleet/local_replicas.py `retire`);
- retire_warm: a STANDBY worker the schedule no longer wants stops (it has no traffic).

A serving worker that dies is restarted by its supervisor; meanwhile the policy sees one
serving worker fewer and promotes a standby at once (REPLACE). The restarted worker rejoins as
STANDBY: every STARTING worker of an autoscaled version is marked to, so a death never ends
with one worker too many serving. Versions are scaled only while they carry traffic (replica
goal RUN); retired ones are stopped by the replicas' reconcile as before.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sluice.aio import cancel_and_wait
from sluice.routing.dispatch.worker_pool import WorkerStatus
from sluice.routing.fleet.local_replicas import LocalReplicas
from sluice.routing.fleet.members import FleetMembers
from sluice.routing.fleet_file.registry import Registry
from sluice.routing.fleet_file.scaling_settings import ScalingSettings
from sluice.routing.scaling.decision import FleetObservation, ScalingDecision
from sluice.routing.scaling.observation import Demand, VersionLoad, observations, version_load
from sluice.routing.scaling.policy import Clock, ScalingPolicy, SystemClock
from sluice.routing.state.follower import StateFollower
from sluice.routing.state.replica_plan import ReplicaGoal, replica_goal
from sluice.routing.state.routing_state import effective_weights

log = logging.getLogger("sluice.autoscale")
# a version whose cold start failed waits this long before the next (real time: a start's
# failure and retry are about processes, not the policy's windows)
START_RETRY_S = 30.0


@dataclass(slots=True)
class VersionScaler:
    """One autoscaled version: its policy and what the driver did for it."""

    settings: ScalingSettings
    policy: ScalingPolicy
    starts: set[asyncio.Task] = field(default_factory=set)  # cold starts still loading
    start_failed_at: float | None = None
    last: ScalingDecision | None = None
    observed: FleetObservation | None = None
    done: Counter = field(default_factory=Counter)  # action -> times run, for the status


class LocalAutoscaler:
    def __init__(
        self,
        members: FleetMembers,
        replicas: LocalReplicas,
        registry: Registry,
        follower: StateFollower,
        demand: Callable[[], Demand],
        clock: Clock | None = None,
    ):
        self.members, self.replicas, self.registry, self.follower = members, replicas, registry, follower
        self.demand = demand  # the admission queue's waiting work, read at each tick
        self.clock: Clock = clock or SystemClock()
        self.scalers: dict[tuple[str, str], VersionScaler] = {}
        self.on_decision: list[Callable[[str, str, ScalingDecision], None]] = []  # tests, benchmarks

    # -- the loop -----------------------------------------------------------------------------
    async def run(self) -> None:
        while True:
            try:
                self.tick()
            except Exception:  # one failed step must not end autoscaling: the next tries again
                log.exception("autoscaling tick failed")
            await asyncio.sleep(self.registry.fleet.autoscale_interval_s)

    def tick(self) -> dict[tuple[str, str], ScalingDecision]:
        """Observe every autoscaled version that carries traffic, decide, act (the slow parts
        — starting and draining — run as tasks; promotion is done when this returns)."""
        running = self._versions_to_scale()
        for key in [k for k in self.scalers if k not in running]:
            self._forget(key)
        loads: list[VersionLoad] = []
        for key in running:
            scaler = self._scaler(key)
            self._rejoin_as_standby(key)
            loads.append(version_load(*key, self.members.pool, self.members.handles.values(), len(scaler.starts)))
        decisions = {}
        for key, obs in (observations(loads, self.demand()) if loads else {}).items():
            scaler = self.scalers[key]
            decision = scaler.policy.decide(obs)
            scaler.last, scaler.observed = decision, obs
            self._act(key, scaler, decision, next(v for v in loads if (v.model_id, v.version) == key))
            decisions[key] = decision
            for callback in self.on_decision:
                callback(*key, decision)
        return decisions

    def _versions_to_scale(self) -> list[tuple[str, str]]:
        spec, snapshot = self.registry.fleet, self.follower.snapshot
        out = []
        for model_id, version in spec.autoscaled():
            model = spec.models[model_id]
            live = snapshot.model(model_id)
            weight = effective_weights(model, live).get(version, 0.0)
            if replica_goal(model.versions[version], live.state_of(version), weight) is ReplicaGoal.RUN:
                out.append((model_id, version))
        return out

    def _scaler(self, key: tuple[str, str]) -> VersionScaler:
        settings = self.registry.fleet.scaling(*key)
        assert settings is not None
        scaler = self.scalers.get(key)
        if scaler is None or scaler.settings != settings:  # new, or the fleet file was reloaded
            initial = self.registry.fleet.models[key[0]].versions[key[1]].replicas
            if scaler is not None:
                initial = scaler.policy.desired_serving  # a reload keeps the count it had reached
            policy = ScalingPolicy(settings, self.clock, initial_serving=initial)
            scaler = VersionScaler(settings, policy, starts=scaler.starts if scaler else set())
            self.scalers[key] = scaler
        return scaler

    def _forget(self, key: tuple[str, str]) -> None:
        scaler = self.scalers.pop(key)
        for task in scaler.starts:
            task.cancel()

    def _rejoin_as_standby(self, key: tuple[str, str]) -> None:
        for h in self.members.handles.values():
            if (
                (h.model_id, h.version) == key
                and (w := self.members.pool.get(h.worker_id)) is not None
                and w.status is WorkerStatus.STARTING
            ):
                h.join_status = WorkerStatus.STANDBY

    # -- acting -------------------------------------------------------------------------------
    def _act(self, key: tuple[str, str], scaler: VersionScaler, d: ScalingDecision, load: VersionLoad) -> None:
        a = d.actions
        if a.none:
            return
        replicas = self.replicas
        log.info(
            "autoscaling %s/%s: %s (signal %.3f, serving %d→%d, warm pool %d→%d): %s",
            *key,
            d.reason.value,
            d.signal,
            len(load.serving),
            d.desired_serving,
            len(load.standby),
            d.desired_warm,
            a,
        )
        standby = sorted(load.standby, key=lambda w: w.worker_id)
        for w in standby[: a.promote]:
            self.members.pool.set_status(w.worker_id, WorkerStatus.WARM)
            self.members.handles[w.worker_id].join_status = WorkerStatus.WARM
        for w in standby[a.promote : a.promote + a.retire_warm]:
            replicas.retire(w.worker_id, "the warm pool is larger than its schedule wants")
        # drain the least busy first: fewer requests to wait for
        serving = sorted(load.serving, key=lambda w: (w.inflight, w.dispatched_tokens))
        for w in serving[: a.drain_to_warm]:
            replicas.drain_to_standby(w.worker_id)
        for w in serving[a.drain_to_warm : a.drain_to_warm + a.drain_and_stop]:
            replicas.retire(w.worker_id, f"autoscaling: {d.reason.value}")
        self._start(key, scaler, a.start)
        scaler.done.update(
            {
                name: n
                for name, n in (
                    ("promote", a.promote),
                    ("start", a.start),
                    ("drain_to_warm", a.drain_to_warm),
                    ("drain_and_stop", a.drain_and_stop),
                    ("retire_warm", a.retire_warm),
                )
                if n
            }
        )

    def _start(self, key: tuple[str, str], scaler: VersionScaler, n: int) -> None:
        now = time.monotonic()
        if n <= 0 or (scaler.start_failed_at is not None and now - scaler.start_failed_at < START_RETRY_S):
            return
        for _ in range(n):
            task = asyncio.get_running_loop().create_task(
                self._start_one(key, scaler), name=f"sluice-scale-{key[0]}/{key[1]}"
            )
            scaler.starts.add(task)

    async def _start_one(self, key: tuple[str, str], scaler: VersionScaler) -> None:
        try:
            worker_id = await self.replicas.start_one(*key, join=WorkerStatus.STANDBY)
            scaler.start_failed_at = None
            log.info("autoscaling %s/%s: worker %s loaded; it joins the warm pool once warmed up", *key, worker_id)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            scaler.start_failed_at = time.monotonic()
            log.error("autoscaling %s/%s: a worker failed to start: %s (next try in %.0f s)", *key, exc, START_RETRY_S)
        finally:
            # the same step that added the worker to the pool (as STARTING): never counted twice
            scaler.starts.discard(asyncio.current_task())

    # -- the operator's view ------------------------------------------------------------------
    def status(self) -> list[dict[str, Any]]:
        out = []
        for (model_id, version), sc in self.scalers.items():
            d, obs, s = sc.last, sc.observed, sc.settings
            out.append(
                {
                    "model": model_id,
                    "version": version,
                    "signal": round(obs.signal, 4) if obs else None,
                    "batch_signal": round(obs.batch_signal, 4) if obs else None,
                    "serving": obs.serving if obs else None,
                    "warm_pool": obs.warm if obs else None,
                    "starting": obs.starting if obs else None,
                    "draining": obs.draining if obs else None,
                    "desired_serving": d.desired_serving if d else sc.policy.desired_serving,
                    "desired_warm_pool": d.desired_warm if d else None,
                    "reason": d.reason.value if d else None,
                    "batch_waits_for_cold": d.batch_waits_for_cold if d else False,
                    "scale_up_at": s.scale_up_at,
                    "scale_down_at": s.scale_down_at,
                    "min_serving": s.min_serving,
                    "max_workers": s.max_workers,
                    "actions": dict(sc.done),
                }
            )
        return out

    async def close(self) -> None:
        await cancel_and_wait([t for sc in self.scalers.values() for t in sc.starts])
