"""The local replicas of one gateway: `sluice worker` children started, drained and stopped as
the fleet file and the live routing state ask (state/replica_plan.py decides what should run).

- Starting runs in the background, one task per version at a time, so a model load never holds
  up the rollouts' ticks; a version whose replica failed to start is tried again after
  `START_RETRY_S` while it is still needed (a rollout's target that never starts is rolled back
  by its warm timeout).
- Retiring a worker takes it out of routing at once (DRAINING: no new requests), lets this
  gateway's requests on it finish — at most the rollout's `drain_timeout_s` — then stops the
  replica (or disconnects a remote worker). Other gateways' requests on a shared *remote*
  worker are not cut: sluice never stops a remote worker, only stops using it.
- `reconcile()` runs on every gateway every tick, not only on the gateway driving a rollout, so
  every gateway with local replicas starts a rollout's target and stops retired versions.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from sluice.aio import cancel_and_wait
from sluice.common.backoff import RestartBackoff
from sluice.config import Settings
from sluice.routing.dispatch.health_poller import WorkerHandle
from sluice.routing.dispatch.worker_pool import WorkerStatus
from sluice.routing.fleet.members import FleetMembers
from sluice.routing.fleet.replica_launch import local_replica_count, replica_launch
from sluice.routing.fleet_file.registry import Registry
from sluice.routing.fleet_file.schema import VersionSpec
from sluice.routing.state.follower import StateFollower
from sluice.routing.state.replica_plan import ReplicaGoal, replica_goal
from sluice.routing.state.routing_state import effective_weights
from sluice.worker.grpc_client import GrpcEngineClient
from sluice.worker.supervisor import WorkerSupervisor

log = logging.getLogger("sluice.routing")
START_RETRY_S = 30.0


class LocalReplicas:
    def __init__(self, members: FleetMembers, registry: Registry, follower: StateFollower, settings: Settings):
        self.members, self.registry, self.follower, self.settings = members, registry, follower, settings
        self._starting: dict[tuple[str, str], asyncio.Task] = {}  # version -> its start
        self._start_failed: dict[tuple[str, str], float] = {}  # version -> monotonic time of a failed start
        self._retiring: dict[str, asyncio.Task] = {}  # worker id -> its drain-then-stop
        self._stopping: set[asyncio.Task] = set()  # stops under way (the workers left `handles`)

    # -- starting -----------------------------------------------------------------------------
    async def start(self, model_id: str, version: str) -> None:
        """Start the version's missing local replicas; returns when they are ready (loaded)."""
        spec = self.registry.version(model_id, version)
        running = self.local(model_id, version)
        await asyncio.gather(*(self._start_one(model_id, version, spec) for _ in range(spec.replicas - len(running))))

    async def start_one(self, model_id: str, version: str, join: WorkerStatus = WorkerStatus.WARM) -> str:
        """One more local replica of the version (the autoscaler's cold start); returns its id
        once loaded. `join`: the status it takes once warmed up (STANDBY: the warm pool)."""
        return await self._start_one(model_id, version, self.registry.version(model_id, version), join)

    async def _start_one(
        self, model_id: str, version: str, spec: VersionSpec, join: WorkerStatus = WorkerStatus.WARM
    ) -> str:
        s = self.settings
        launch = replica_launch(s, spec, local_replica_count(self.registry.fleet))
        supervisor = WorkerSupervisor(
            launch.model,
            launch.dtype,
            launch.engine_args,
            s.worker_start_timeout_s,
            RestartBackoff(s.worker_max_restarts, s.worker_restart_window_s),
        )
        try:
            client = await supervisor.start(GrpcEngineClient)
        except BaseException:
            await supervisor.stop()
            raise
        assert supervisor.worker is not None
        log.info("local worker %s/%s started (pid %d)", model_id, version, supervisor.worker.pid)
        address = supervisor.address
        self.members.add_worker(model_id, version, address, client, supervisor)
        self.members.handles[address].join_status = join  # before the poller can warm it up
        supervisor.on_give_up = lambda why: self.members.gave_up(address, why)
        supervisor.watch(client)
        return address

    def local(self, model_id: str, version: str) -> list[WorkerHandle]:
        """The version's local replicas that are not on their way out."""
        return [
            h
            for h in self.members.handles.values()
            if h.supervisor is not None
            and h.worker_id not in self._retiring
            and (h.model_id, h.version) == (model_id, version)
        ]

    def versions_to_run(self) -> list[tuple[str, str]]:
        snapshot = self.follower.snapshot
        out = []
        for model_id, model in self.registry.fleet.models.items():
            live = snapshot.model(model_id)
            weights = effective_weights(model, live)
            out += [
                (model_id, name)
                for name, spec in model.versions.items()
                if replica_goal(spec, live.state_of(name), weights.get(name, 0.0)) is ReplicaGoal.RUN
            ]
        return out

    # -- reconciling --------------------------------------------------------------------------
    def reconcile(self) -> tuple[list[str], list[str]]:
        """Start the missing replicas of versions that carry traffic; drain and stop those of
        retired or removed versions and any above a version's `replicas`. Returns what began
        starting (model/version) and stopping (worker ids)."""
        snapshot, models = self.follower.snapshot, self.registry.fleet.models
        starting: list[str] = []
        stopping: list[str] = []
        for model_id, model in models.items():
            live = snapshot.model(model_id)
            weights = effective_weights(model, live)
            for name, spec in model.versions.items():
                state = live.state_of(name)
                goal = replica_goal(spec, state, weights.get(name, 0.0))
                local = self.local(model_id, name)
                if spec.autoscale is not False and goal is not ReplicaGoal.STOP:
                    continue  # the autoscaler owns the count (routing/fleet/autoscaler.py)
                keep = 0 if goal is ReplicaGoal.STOP else spec.replicas
                why = (
                    f"{model_id}/{name} is {state.value}"
                    if goal is ReplicaGoal.STOP
                    else "more than the version's replicas"
                )
                stopping += [self.retire(h.worker_id, why) for h in local[keep:]]
                if goal is ReplicaGoal.RUN and len(local) < spec.replicas and self._begin_start(model_id, name):
                    starting.append(f"{model_id}/{name}")
        for h in list(self.members.handles.values()):
            declared = h.model_id in models and h.version in models[h.model_id].versions
            if h.supervisor is not None and not declared and h.worker_id not in self._retiring:
                stopping.append(self.retire(h.worker_id, f"{h.model_id}/{h.version} left the fleet file"))
        return starting, stopping

    def _begin_start(self, model_id: str, version: str) -> bool:
        key = (model_id, version)
        task = self._starting.get(key)
        if task is not None and not task.done():
            return False
        failed_at = self._start_failed.get(key)
        if failed_at is not None and time.monotonic() - failed_at < START_RETRY_S:
            return False
        self._starting[key] = asyncio.get_running_loop().create_task(
            self._start_in_background(model_id, version), name=f"sluice-start-{model_id}/{version}"
        )
        return True

    async def _start_in_background(self, model_id: str, version: str) -> None:
        try:
            await self.start(model_id, version)
            self._start_failed.pop((model_id, version), None)
        except Exception as exc:
            self._start_failed[(model_id, version)] = time.monotonic()
            log.error(
                "a local worker of %s/%s failed to start: %s (tried again in %.0f s while needed)",
                model_id,
                version,
                exc,
                START_RETRY_S,
            )

    # -- stopping -----------------------------------------------------------------------------
    def retiring(self, worker_id: str) -> bool:
        return worker_id in self._retiring

    def retire(self, worker_id: str, why: str) -> str:
        """Drain then stop (or disconnect) a worker; idempotent. Returns its id."""
        h = self.members.handles.get(worker_id)
        if h is not None and worker_id not in self._retiring:
            log.info("worker %s (%s/%s) drains and stops: %s", worker_id, h.model_id, h.version, why)
            self.members.pool.set_status(worker_id, WorkerStatus.DRAINING)
            timeout_s = self.registry.fleet.rollout.drain_timeout_s
            self._retiring[worker_id] = asyncio.get_running_loop().create_task(
                self._drain_and_drop(h, timeout_s), name=f"sluice-retire-{worker_id}"
            )
        return worker_id

    def drain_to_standby(self, worker_id: str) -> None:
        """Serving → DRAINING → STANDBY (a scale-down that keeps the model loaded for the warm
        pool): no new requests at once, this gateway's in-flight ones finish first — at most
        the rollout's `drain_timeout_s`; a request still running then just runs on."""
        h = self.members.handles.get(worker_id)
        if h is None or worker_id in self._retiring:
            return
        log.info("worker %s (%s/%s) drains into the warm pool", worker_id, h.model_id, h.version)
        self.members.pool.set_status(worker_id, WorkerStatus.DRAINING)
        h.join_status = WorkerStatus.STANDBY
        timeout_s = self.registry.fleet.rollout.drain_timeout_s
        self._retiring[worker_id] = asyncio.get_running_loop().create_task(
            self._drain_to_standby(h, timeout_s), name=f"sluice-standby-{worker_id}"
        )

    async def _drain_to_standby(self, h: WorkerHandle, timeout_s: float) -> None:
        try:
            await self._drained(h, timeout_s)
            if (w := self.members.pool.get(h.worker_id)) is not None and w.status is WorkerStatus.DRAINING:
                self.members.pool.set_status(h.worker_id, WorkerStatus.STANDBY)
        finally:
            self._retiring.pop(h.worker_id, None)

    async def _drained(self, h: WorkerHandle, timeout_s: float) -> None:
        """Return once the worker has no request in flight or left the pool, or after `timeout_s`."""
        if (w := self.members.pool.get(h.worker_id)) is None:
            return
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s):
                await w.settled.wait()

    async def _drain_and_drop(self, h: WorkerHandle, timeout_s: float) -> None:
        try:
            await self._drained(h, timeout_s)
            await self.drop(h)
        finally:
            self._retiring.pop(h.worker_id, None)

    async def drop(self, h: WorkerHandle) -> None:
        """Remove a worker now (no drain): out of the pool, its replica stopped, its client closed."""
        self.members.remove(h)
        # out of `handles`, only this task still knows the process: finish stopping it even if
        # the caller is cancelled (close() waits for it)
        stopping = asyncio.get_running_loop().create_task(self._stop(h))
        self._stopping.add(stopping)
        stopping.add_done_callback(self._stopping.discard)
        await asyncio.shield(stopping)

    async def _stop(self, h: WorkerHandle) -> None:
        if h.supervisor is not None:
            await h.supervisor.stop()
        await h.client.close()
        log.info("worker %s (%s/%s) stopped", h.worker_id, h.model_id, h.version)

    async def close(self) -> None:
        """Cancel starts and drains (their workers are still in `handles`: the fleet stops them)
        and wait for the stops under way."""
        await cancel_and_wait([*self._starting.values(), *self._retiring.values()])
        for task in list(self._stopping):  # the stops themselves finish
            try:
                await task
            except Exception:
                pass
