"""The running fleet of one gateway: every worker it routes to, and the parts that keep them honest.

Built from a FleetSpec (a fleet file, or the fleet of one today's settings describe):
- local replicas (`replicas = N`): `sluice worker` children, each with a supervisor that
  restarts it (worker/supervisor.py); remote workers (`workers = [...]`): gRPC clients;
- the health poller (health, load, warm-up, hang detection) writing into the worker pool;
- the router (versions, workers, fallbacks, quotas) over the pool and the live routing state,
  which a follower keeps in step with the shared store (Redis when `limits_store = "redis"`);
- the rollout driver, ticked once a second for the rollouts this gateway drives, and on the
  same tick the local replicas reconciled with the live state (local_replicas.py: a rollout's
  target started, retired versions drained and stopped — on every gateway);
- per version: the tokenizer (from its weights; the gateway renders prompts) and model info;
- the local autoscaler (autoscaler.py), on its own short interval: the replica count, warm
  pool, promotions and drains of the versions whose fleet-file entry says `autoscale`.

A reloaded fleet file is applied by fleet_reload.py; the operator's view is fleet_status.py.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sluice.config import Settings
from sluice.engine.config import EngineConfig
from sluice.engine.stats import EngineStats
from sluice.errors import EngineUnavailableError, ModelLoadError
from sluice.models.tokenizer import Tokenizer
from sluice.routing.autoscale_observation import Demand
from sluice.routing.autoscaler import LocalAutoscaler
from sluice.routing.fleet_schema import BUNDLED, VersionSpec
from sluice.routing.fleet_reload import has_quotas
from sluice.routing.fleet_status import fleet_status
from sluice.routing.health_poller import HealthPoller, WorkerHandle
from sluice.routing.local_replicas import LocalReplicas
from sluice.routing.quota import QuotaStore, make_quota_store
from sluice.routing.registry import Registry
from sluice.routing.rollout import RolloutSignals
from sluice.routing.rollout_driver import RolloutDriver
from sluice.routing.scaling_signal import model_signals
from sluice.routing.router import FleetRouter
from sluice.routing.routing_state import RoutingStateStore, make_routing_state_store
from sluice.routing.state_follower import StateFollower
from sluice.routing.version_router import version_header
from sluice.routing.worker_pool import WorkerEntry, WorkerPool, WorkerStatus
from sluice.worker.engine_client import EngineClient, ModelInfo
from sluice.worker.grpc_client import GrpcEngineClient
from sluice.worker.supervisor import WorkerSupervisor

log = logging.getLogger("sluice.routing")
TICK_S = 1.0  # how often the rollouts this gateway drives move on and the replicas are reconciled
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
    # the admission queue's waiting work (the serving layer sets it, runtime.mark_ready: routing
    # cannot import the gateway); the autoscaler and the exported scaling signal share it out
    demand: Callable[[], Demand] = Demand
    poller: HealthPoller | None = None
    _tasks: list[asyncio.Task] = field(default_factory=list)
    _tokenizers: dict[str, Tokenizer] = field(default_factory=dict)  # weights path -> tokenizer
    _client_for: Callable[[str], EngineClient] = GrpcEngineClient  # how remote workers are reached
    replicas: LocalReplicas = field(init=False)
    autoscaler: LocalAutoscaler = field(init=False)
    reload_lock: asyncio.Lock = field(default_factory=asyncio.Lock)  # one reload at a time
    tick_s: float = TICK_S

    def __post_init__(self) -> None:
        self.replicas = LocalReplicas(self)
        self.autoscaler = LocalAutoscaler(self)  # idle until a version says `autoscale`

    @classmethod
    def build(cls, settings: Settings, registry: Registry) -> Fleet:
        fleet_spec = registry.fleet
        pool = WorkerPool(fleet_spec.routing.breaker.config())
        store = make_routing_state_store(settings.limits_store, settings.redis_url)
        follower = StateFollower(store)
        quota = make_quota_store(settings.limits_store, settings.redis_url) if has_quotas(fleet_spec) else None
        router = FleetRouter(registry, pool, quota, lambda: follower.snapshot, EngineConfig.from_settings(settings))
        return cls(settings, registry, pool, router, store, follower, quota, RolloutDriver(store, registry))

    # -- bring-up -----------------------------------------------------------------------------
    async def start(self, client_for: Callable[[str], EngineClient] = GrpcEngineClient,
                    inline: EngineClient | None = None) -> None:
        """Load the tokenizers, connect the remote workers, start the local replicas of the
        versions that carry traffic (returns when every one has started or failed to; raises
        if no worker could start at all). `inline`: an in-process engine that serves the
        (single) version instead of a replica."""
        s = self.settings
        self._client_for = client_for
        await self.follower.poll_once()  # live state first: a rollout may have moved traffic
        if inline is not None:
            (model_id, model), = self.registry.fleet.models.items()
            (name, _), = model.versions.items()
            self.add_worker(model_id, name, INLINE_WORKER, inline)
        for model_id, model in self.registry.fleet.models.items():
            for name, version in model.versions.items():
                self.versions[(model_id, name)] = VersionRuntime(await asyncio.to_thread(self.tokenizer_for, version))
                for address in version.workers:
                    self.add_remote(model_id, name, address)
        # versions that carry traffic start now; one staged with traffic 0 starts when a
        # rollout (or an operator's weights) needs it (replica_plan.py)
        starts = [self.replicas.start(m, v) for m, v in self.replicas.versions_to_run()] if inline is None else []
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
                        loop.create_task(self._tick_forever(), name="sluice-fleet-ticker"),
                        loop.create_task(self.autoscaler.run(), name="sluice-autoscaler")]

    def add_worker(self, model_id: str, version: str, address: str, client: EngineClient,
                   supervisor: WorkerSupervisor | None = None) -> WorkerEntry:
        self.handles[address] = WorkerHandle(address, model_id, version, address, client, supervisor)
        entry = self.pool.get(address)
        if entry is None:
            limit = self.registry.version(model_id, version).max_outstanding_tokens
            entry = self.pool.add(address, model_id, version, address, max_outstanding_tokens=limit)
        return entry

    def add_remote(self, model_id: str, version: str, address: str) -> WorkerEntry:
        """A running `sluice worker` listed in the fleet file (STARTING until the poller warms it)."""
        entry = self.add_worker(model_id, version, address, self._client_for(address))
        entry.remote = True
        return entry

    def sync_versions(self, declared: dict[tuple[str, str], VersionSpec]) -> None:
        """Per-version runtimes for exactly the declared versions (after a reload)."""
        for key in [k for k in self.versions if k not in declared]:
            del self.versions[key]
        for key, spec in declared.items():
            if key not in self.versions:
                self.versions[key] = VersionRuntime(self.tokenizer_for(spec))

    def gave_up(self, worker_id: str, why: str) -> None:
        self.pool.set_status(worker_id, WorkerStatus.STOPPED)
        # a warm-pool worker is alive too: the autoscaler promotes it
        if not any(self.pool.takes_requests(w) or w.status in (WorkerStatus.STARTING, WorkerStatus.STANDBY)
                   for w in (self.pool.get(h) for h in self.handles) if w is not None):
            if self.on_give_up is not None:
                self.on_give_up(why)

    def tokenizer_for(self, spec: VersionSpec) -> Tokenizer:
        """The version's tokenizer (one per weights path; blocking: call it off the loop)."""
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

    async def fresh_stats(self, timeout_s: float = 2.0) -> dict[tuple[str, str], list[EngineStats]]:
        """(model, <model>/<version>) -> the statistics its workers answered now (a scrape shows
        the engines as they are), for every version that has workers; [] when none answered."""
        async def one(h: WorkerHandle) -> EngineStats | None:
            try:
                return await asyncio.wait_for(h.client.stats(), timeout_s)
            except Exception:
                return None

        handles = list(self.handles.values())
        results = await asyncio.gather(*(one(h) for h in handles))
        out: dict[tuple[str, str], list[EngineStats]] = {}
        for h, r in zip(handles, results):
            answered = out.setdefault((h.model_id, version_header(h.model_id, h.version)), [])
            if r is not None:
                answered.append(r)
        return out

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

    def scaling_signals(self) -> dict[str, float]:
        """model id -> its scaling signal (scaling_signal.py), for every model of the fleet: the
        `sluice_scaling_signal{model}` gauge, the autoscaler's numbers pooled per model."""
        models = {m: list(model.versions) for m, model in self.registry.fleet.models.items()}
        return model_signals(models, self.pool, self.handles.values(), self.demand())

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

    def warm_pool_counts(self) -> dict[tuple[str, str], int]:
        """(model, <model>/<version>) -> STANDBY workers, for the `sluice_warm_pool_workers`
        gauge: every autoscaled version (0 included) and any version with one."""
        counts = {(m, version_header(m, v)): 0 for m, v in self.registry.fleet.autoscaled()}
        for (model, version, state), n in self.worker_counts().items():
            if state == WorkerStatus.STANDBY.value:
                counts[(model, version)] = n
        return counts

    def status(self) -> dict[str, Any]:
        """The fleet as an operator sees it (the admin API's /admin/fleet)."""
        return fleet_status(self)

    # -- the ticker ---------------------------------------------------------------------------
    async def _tick_forever(self) -> None:
        while True:
            await asyncio.sleep(self.tick_s)
            await self.tick()

    async def tick(self) -> None:
        """Move the rollouts this gateway drives on, then reconcile the local replicas with the
        live state (on every gateway: followers start a rollout's target and stop retired
        versions too)."""
        for model_id, rollout in list(self.driver.rollouts.items()):
            try:
                signals = RolloutSignals(
                    self.pool.warm(model_id, rollout.target),
                    self.pool.inflight(model_id, rollout.target),
                    sum(self.pool.inflight(model_id, v) for v in rollout.sources),
                )
                await self.driver.tick(model_id, signals)
            except Exception:  # a rollout step failed: log it, the next tick tries again
                log.exception("rollout of %s: tick failed", model_id)
        try:
            await self.follower.poll_once()  # what the ticks wrote, before reconciling
            self.replicas.reconcile()
        except Exception:
            log.exception("reconciling the local replicas failed")

    async def close(self) -> None:
        self.follower.stop()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            try:
                await task
            except (asyncio.CancelledError, Exception):
                pass
        await self.autoscaler.close()
        await self.replicas.close()
        if self.poller is not None:
            await self.poller.stop()
        for h in list(self.handles.values()):
            if h.supervisor is not None:
                await h.supervisor.stop()
            await h.client.close()
        await self.state_store.close()
        if self.quota is not None:
            await self.quota.close()

