"""The running fleet of one gateway: every worker it routes to, and the parts that keep them honest.

Built from a FleetSpec (a fleet file, or the fleet of one today's settings describe):
- local replicas (`replicas = N`): `sluice worker` children, each with a supervisor that
  restarts it (worker/supervisor.py); remote workers (`workers = [...]`): gRPC clients;
- the health poller (health, load, warm-up, hang detection) writing into the worker pool;
- the router (versions, workers, fallbacks, quotas) over the pool and the live routing state,
  which a follower keeps in step with the shared store (Redis when `limits_store = "redis"`);
- the rollout driver, ticked once a second for the rollouts this gateway drives;
- per version: the tokenizer (from its weights; the gateway renders prompts) and model info.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from sluice.config import Settings
from sluice.engine.config import EngineConfig
from sluice.engine.stats import EngineStats
from sluice.errors import EngineUnavailableError, ModelLoadError
from sluice.models.tokenizer import Tokenizer
from sluice.routing.fleet_schema import BUNDLED, FleetSpec, VersionSpec
from sluice.routing.health_poller import HealthPoller, WorkerHandle
from sluice.routing.quota import QuotaStore, make_quota_store
from sluice.routing.registry import Registry
from sluice.routing.rollout import RolloutPhase, RolloutSignals
from sluice.routing.rollout_driver import RolloutDriver
from sluice.routing.router import FleetRouter
from sluice.routing.routing_state import RoutingStateStore, effective_weights, make_routing_state_store
from sluice.routing.state_follower import StateFollower
from sluice.routing.version_router import version_header
from sluice.routing.worker_pool import WorkerEntry, WorkerPool, WorkerStatus
from sluice.worker.engine_client import EngineClient, ModelInfo
from sluice.worker.grpc_client import GrpcEngineClient
from sluice.worker.restart_policy import RestartPolicy
from sluice.worker.spawn import engine_argv
from sluice.worker.supervisor import WorkerSupervisor

log = logging.getLogger("sluice.routing")
TICK_S = 1.0  # how often the rollouts this gateway drives move on
INLINE_WORKER = "inline"  # the worker id of an in-process engine (`--worker inline`)


@dataclass(slots=True)
class VersionRuntime:
    """What the gateway holds per model version: its tokenizer and the engine's limits."""

    tokenizer: Tokenizer
    info: ModelInfo | None = None  # from a worker, once one answered


@dataclass
class Fleet:
    settings: Settings
    registry: Registry
    pool: WorkerPool
    router: FleetRouter
    state_store: RoutingStateStore
    follower: StateFollower
    quota: QuotaStore | None
    driver: RolloutDriver
    handles: dict[str, WorkerHandle] = field(default_factory=dict)
    versions: dict[tuple[str, str], VersionRuntime] = field(default_factory=dict)
    on_give_up: Callable[[str], None] | None = None  # a local worker kept dying
    poller: HealthPoller | None = None
    _tasks: list[asyncio.Task] = field(default_factory=list)
    _tokenizers: dict[str, Tokenizer] = field(default_factory=dict)  # weights path -> tokenizer

    @classmethod
    def build(cls, settings: Settings, registry: Registry) -> Fleet:
        fleet_spec = registry.fleet
        pool = WorkerPool(fleet_spec.routing.breaker.config())
        store = make_routing_state_store(settings.limits_store, settings.redis_url)
        follower = StateFollower(store)
        quota = make_quota_store(settings.limits_store, settings.redis_url) if _has_quotas(fleet_spec) else None
        router = FleetRouter(registry, pool, quota, lambda: follower.snapshot, EngineConfig.from_settings(settings))
        return cls(settings, registry, pool, router, store, follower, quota, RolloutDriver(store, registry))

    # -- bring-up -----------------------------------------------------------------------------
    async def start(self, client_for: Callable[[str], EngineClient] = GrpcEngineClient,
                    inline: EngineClient | None = None) -> None:
        """Load the tokenizers, connect the remote workers, start the local replicas (returns
        when every replica has started or failed to; raises if no worker could start at all).
        `inline`: an in-process engine that serves the (single) version instead of a replica."""
        s = self.settings
        await self.follower.poll_once()
        if inline is not None:
            (model_id, model), = self.registry.fleet.models.items()
            (name, _), = model.versions.items()
            self._add(model_id, name, INLINE_WORKER, inline)
        for model_id, model in self.registry.fleet.models.items():
            for name, version in model.versions.items():
                self.versions[(model_id, name)] = VersionRuntime(await asyncio.to_thread(self._tokenizer, version))
                for address in version.workers:
                    self._add(model_id, name, address, client_for(address)).remote = True
        # versions that carry traffic start now; one staged with traffic 0 starts when a
        # rollout (or an operator's weights) needs it
        starts = [self.start_replicas(model_id, name) for model_id, model in self.registry.fleet.models.items()
                  for name, version in model.versions.items() if version.traffic > 0 and inline is None]
        results = await asyncio.gather(*starts, return_exceptions=True)
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors and not self.handles:
            raise errors[0]
        for e in errors:
            log.error("a local worker failed to start: %s", e)
        self.poller = HealthPoller(self.pool, self.handles, s.health_check_interval_s, s.health_check_timeout_s)
        await self.poller.poll_once()  # warm up what is ready, so serving starts warm
        self.poller.start()
        loop = asyncio.get_running_loop()
        self._tasks += [loop.create_task(self.follower.run(), name="sluice-routing-follower"),
                        loop.create_task(self._drive_rollouts(), name="sluice-rollouts")]

    def _add(self, model_id: str, version: str, address: str, client: EngineClient,
             supervisor: WorkerSupervisor | None = None) -> WorkerEntry:
        self.handles[address] = WorkerHandle(address, model_id, version, address, client, supervisor)
        entry = self.pool.get(address)
        if entry is None:
            limit = self.registry.version(model_id, version).max_outstanding_tokens
            entry = self.pool.add(address, model_id, version, address, max_outstanding_tokens=limit)
        return entry

    async def start_replicas(self, model_id: str, version: str) -> None:
        """Start the version's local replicas (those not running yet)."""
        spec = self.registry.version(model_id, version)
        running = [h for h in self.handles.values() if h.supervisor is not None
                   and (h.model_id, h.version) == (model_id, version)]
        await asyncio.gather(*(self._start_replica(model_id, version, spec) for _ in range(spec.replicas - len(running))))

    async def _start_replica(self, model_id: str, version: str, spec: VersionSpec) -> None:
        s = self.settings
        config = spec.engine.apply(EngineConfig.from_settings(s))
        supervisor = WorkerSupervisor(
            None if spec.weights == BUNDLED else spec.weights, spec.dtype or s.dtype,
            engine_argv(config, spec.fault_injection), s.worker_start_timeout_s,
            RestartPolicy(s.worker_max_restarts, s.worker_restart_window_s),
        )
        try:
            client = await supervisor.start(GrpcEngineClient)
        except BaseException:
            await supervisor.stop()
            raise
        assert supervisor.worker is not None
        log.info("local worker %s/%s started (pid %d)", model_id, version, supervisor.worker.pid)
        address = supervisor.address
        self._add(model_id, version, address, client, supervisor)
        supervisor.on_give_up = lambda why: self._gave_up(address, why)
        supervisor.watch(client)

    def _gave_up(self, worker_id: str, why: str) -> None:
        self.pool.set_status(worker_id, WorkerStatus.STOPPED)
        if not any(self.pool.takes_requests(w) or w.status is WorkerStatus.STARTING
                   for w in (self.pool.get(h) for h in self.handles) if w is not None):
            if self.on_give_up is not None:
                self.on_give_up(why)

    async def stop_replicas(self, model_id: str, version: str) -> None:
        """Stop the version's local replicas (a retired version after a rollout)."""
        for h in [h for h in self.handles.values() if h.supervisor is not None and (h.model_id, h.version) == (model_id, version)]:
            self.pool.set_status(h.worker_id, WorkerStatus.STOPPED)
            del self.handles[h.worker_id]
            self.pool.remove(h.worker_id)
            assert h.supervisor is not None
            await h.supervisor.stop()
            await h.client.close()

    def _tokenizer(self, spec: VersionSpec) -> Tokenizer:
        from sluice.models.tokenizer_loader import load_tokenizer

        key = spec.weights
        if key not in self._tokenizers:
            path = None if spec.weights == BUNDLED else spec.weights
            if path is not None and not Path(path).exists():
                raise ModelLoadError(f"{path}: the gateway renders prompts with each version's tokenizer, so its "
                                     "weights must be readable on the gateway's host too")
            self._tokenizers[key] = load_tokenizer(path)[0]
        return self._tokenizers[key]

    # -- what the serving path asks -------------------------------------------------------------
    def version(self, model_id: str, version: str) -> VersionRuntime:
        runtime = self.versions[(model_id, version)]
        if runtime.info is None:
            runtime.info = next((h.info for h in self.handles.values()
                                 if (h.model_id, h.version) == (model_id, version) and h.info is not None), None)
        return runtime

    def max_model_len(self, model_id: str, version: str) -> int:
        info = self.version(model_id, version).info
        if info is None:
            raise EngineUnavailableError(f"no worker of {model_id}/{version} has answered yet")
        return info.max_model_len

    def model_window(self, model_id: str) -> int | None:
        """The smallest context window among the model's versions that have answered."""
        windows = [info.max_model_len for (m, v) in self.versions
                   if m == model_id and (info := self.version(m, v).info) is not None]
        return min(windows) if windows else None

    def block_size(self, model_id: str, version: str) -> int:
        """The version's KV block size (prompt-cache accounting is in whole blocks)."""
        spec = self.registry.version(model_id, version)
        return spec.engine.block_size or EngineConfig.from_settings(self.settings).block_size

    async def fresh_stats(self, timeout_s: float = 2.0) -> list[EngineStats]:
        """Every reachable worker's statistics now (a scrape shows the engines as they are)."""
        async def one(h: WorkerHandle) -> EngineStats | None:
            try:
                return await asyncio.wait_for(h.client.stats(), timeout_s)
            except Exception:
                return None

        results = await asyncio.gather(*(one(h) for h in list(self.handles.values())))
        return [r for r in results if r is not None]

    def serving_handles(self) -> list[WorkerHandle]:
        return [h for h in self.handles.values() if (w := self.pool.get(h.worker_id)) is not None and self.pool.takes_requests(w)]

    def capacity(self) -> tuple[int, int]:
        """(KV token capacity, running-sequence capacity) of the workers that take requests: what
        the admission queue may keep in flight, and the denominator of the scaling signal."""
        tokens = seqs = 0
        for h in self.serving_handles():
            if h.stats is not None:
                tokens += h.stats.kv_blocks_total * h.stats.block_size
                seqs += h.stats.max_num_seqs or 0
        return tokens, seqs

    @property
    def ready(self) -> bool:
        """Some worker can take a request now."""
        return any(self.pool.takes_requests(w) for w in (self.pool.get(h) for h in self.handles) if w is not None)

    def not_ready_reason(self) -> str:
        states = [f"{h.worker_id}: {w.status.value}" for h in self.handles.values() if (w := self.pool.get(h.worker_id))]
        return "no worker can take requests (" + ", ".join(states) + ")" if states else "no workers"

    def worker_counts(self) -> dict[tuple[str, str, str], int]:
        """(model, <model>/<version>, state) -> workers, for the `sluice_workers` gauge."""
        counts: dict[tuple[str, str, str], int] = {}
        for h in self.handles.values():
            w = self.pool.get(h.worker_id)
            if w is not None:
                key = (h.model_id, version_header(h.model_id, h.version), w.status.value)
                counts[key] = counts.get(key, 0) + 1
        return counts

    def status(self) -> dict[str, object]:
        """The fleet as an operator sees it (the admin API's /admin/fleet)."""
        snapshot = self.follower.snapshot
        models: dict[str, object] = {}
        for model_id, model in self.registry.fleet.models.items():
            live = snapshot.model(model_id)
            weights = effective_weights(model, live)
            models[model_id] = {
                "aliases": model.aliases,
                "fallbacks": model.fallbacks,
                "versions": {
                    name: {"weights": spec.weights, "traffic": weights.get(name, 0.0),
                           "state": live.state_of(name).value, "replicas": spec.replicas, "workers": spec.workers}
                    for name, spec in model.versions.items()
                },
                "rollout": live.rollout,
            }
        workers = []
        for h in self.handles.values():
            w = self.pool.get(h.worker_id)
            if w is None:
                continue
            pid = h.supervisor.worker.pid if h.supervisor is not None and h.supervisor.worker is not None else None
            workers.append({
                "id": h.worker_id, "model": h.model_id, "version": h.version, "status": w.status.value,
                "breaker": w.breaker.state.value, "inflight": w.inflight, "load_tokens": w.load_tokens,
                "local": h.supervisor is not None, "pid": pid,
                "restarts": h.supervisor.restarts if h.supervisor is not None else 0,
            })
        return {"models": models, "workers": workers, "routing_revision": snapshot.revision}

    # -- rollouts -------------------------------------------------------------------------------
    async def _drive_rollouts(self) -> None:
        while True:
            await asyncio.sleep(TICK_S)
            for model_id, rollout in list(self.driver.rollouts.items()):
                try:
                    if not self.pool.workers(model_id, rollout.target):
                        await self.start_replicas(model_id, rollout.target)
                    signals = RolloutSignals(
                        self.pool.warm(model_id, rollout.target),
                        self.pool.inflight(model_id, rollout.target),
                        sum(self.pool.inflight(model_id, v) for v in rollout.sources),
                    )
                    after = await self.driver.tick(model_id, signals)
                    if after is not None and after.phase.finished:
                        await self._after_rollout(model_id, after.target, list(after.sources), after.phase)
                except Exception:  # a rollout step failed: log it, the next tick tries again
                    log.exception("rollout of %s: tick failed", model_id)

    async def _after_rollout(self, model_id: str, target: str, sources: list[str], phase: RolloutPhase) -> None:
        """A finished rollout: stop the local replicas of what no longer takes traffic."""
        retired = sources if phase is RolloutPhase.DONE else [target]
        for version in retired:
            await self.stop_replicas(model_id, version)

    async def close(self) -> None:
        self.follower.stop()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            try:
                await task
            except (asyncio.CancelledError, Exception):
                pass
        if self.poller is not None:
            await self.poller.stop()
        for h in list(self.handles.values()):
            if h.supervisor is not None:
                await h.supervisor.stop()
            await h.client.close()
        await self.state_store.close()
        if self.quota is not None:
            await self.quota.close()


def _has_quotas(fleet: FleetSpec) -> bool:
    return any(p.quota is not None for m in fleet.models.values() for p in m.tiers.values())
