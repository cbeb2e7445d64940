"""The running fleet of one gateway: every worker it routes to, and the parts that keep them honest.

Built from a FleetSpec (a fleet file, or the fleet of one today's settings describe):
- local replicas (`replicas = N`): `sluice worker` children, each with a supervisor that
  restarts it (worker/supervisor.py); remote workers (`workers = [...]`): gRPC clients;
- the health poller (health, load, warm-up, hang detection) writing into the worker pool;
- the router (versions, workers, fallbacks, quotas) over the pool and the live routing state,
  which a follower keeps in step with the shared store (Redis when `limits_store = "redis"`);
- the rollout driver, ticked once a second for the rollouts this gateway drives, and on the
  same tick the local replicas reconciled with the live state (fleet/local_replicas.py: a rollout's
  target started, retired versions drained and stopped — on every gateway);
- per version: the tokenizer (from its weights; the gateway renders prompts) and model info;
- the local autoscaler (fleet/autoscaler.py), on its own short interval: the replica count, warm
  pool, promotions and drains of the versions whose fleet-file entry says `autoscale`.

The workers themselves are members.py (what the helpers change), the per-version tokenizers
versions.py; a reloaded fleet file is checked and applied by reload.py; the operator's view
is status.py.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sluice.aio import cancel_and_wait
from sluice.config import Settings
from sluice.engine.config import EngineConfig
from sluice.engine.stats import EngineStats
from sluice.routing.dispatch.health_poller import HealthPoller, WorkerHandle
from sluice.routing.dispatch.router import FleetRouter
from sluice.routing.dispatch.version_router import version_header
from sluice.routing.dispatch.worker_pool import WorkerPool, WorkerStatus
from sluice.routing.fleet.adapters import FleetAdapters
from sluice.routing.fleet.autoscaler import LocalAutoscaler
from sluice.routing.fleet.local_replicas import LocalReplicas
from sluice.routing.fleet.members import FleetMembers
from sluice.routing.fleet.reload import apply_reload, check_reload, has_quotas, runtime_specs
from sluice.routing.fleet.status import fleet_status
from sluice.routing.fleet.versions import VersionRuntime, VersionRuntimes
from sluice.routing.fleet_file.adapters import adapter_ref
from sluice.routing.fleet_file.registry import Registry
from sluice.routing.fleet_file.schema import FleetSpec
from sluice.routing.quota.semantics import QuotaStore
from sluice.routing.quota.stores import make_quota_store
from sluice.routing.scaling.observation import Demand
from sluice.routing.scaling.signal import model_signals
from sluice.routing.state.follower import StateFollower
from sluice.routing.state.rollout import RolloutSignals
from sluice.routing.state.rollout_driver import RolloutDriver
from sluice.routing.state.routing_state import RoutingStateStore, leading_version
from sluice.routing.state.stores import make_routing_state_store
from sluice.types import AdapterRef
from sluice.worker.engine_client import EngineClient
from sluice.worker.grpc_client import GrpcEngineClient

log = logging.getLogger("sluice.routing")
TICK_S = 1.0  # how often the rollouts this gateway drives move on and the replicas are reconciled
INLINE_WORKER = "inline"  # the worker id of an in-process engine (`--worker inline`)


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
    # the admission queue's waiting work (the serving layer sets it, runtime.mark_ready: routing
    # cannot import the gateway); the autoscaler and the exported scaling signal share it out
    demand: Callable[[], Demand] = Demand
    poller: HealthPoller | None = None
    _tasks: list[asyncio.Task] = field(default_factory=list)
    members: FleetMembers = field(init=False)
    runtimes: VersionRuntimes = field(init=False)
    replicas: LocalReplicas = field(init=False)
    autoscaler: LocalAutoscaler = field(init=False)
    adapters: FleetAdapters = field(init=False)
    reload_lock: asyncio.Lock = field(default_factory=asyncio.Lock)  # one reload at a time
    tick_s: float = TICK_S

    def __post_init__(self) -> None:
        self.members = FleetMembers(self.registry, self.pool, self.handles)
        self.runtimes = VersionRuntimes(self.handles.values, self.pool.base_of)
        self.adapters = FleetAdapters(self.registry, self.pool, self.members, self.runtimes)
        self.adapters.sync_bases()  # LoRA adapter versions borrow their base's workers
        self.replicas = LocalReplicas(self.members, self.registry, self.follower, self.settings)
        # idle until a version says `autoscale`; `demand` is read at each tick (serving sets it late)
        self.autoscaler = LocalAutoscaler(
            self.members, self.replicas, self.registry, self.follower, lambda: self.demand()
        )

    @classmethod
    def build(cls, settings: Settings, registry: Registry) -> Fleet:
        fleet_spec = registry.fleet
        pool = WorkerPool(fleet_spec.routing.breaker.config())
        store = make_routing_state_store(settings.limits_store, settings.redis_url)
        follower = StateFollower(store)
        quota = make_quota_store(settings.limits_store, settings.redis_url) if has_quotas(fleet_spec) else None
        router = FleetRouter(registry, pool, quota, lambda: follower.snapshot, EngineConfig.from_settings(settings))
        return cls(settings, registry, pool, router, store, follower, quota, RolloutDriver(store, registry))

    @property
    def on_give_up(self) -> Callable[[str], None] | None:
        return self.members.on_give_up

    @on_give_up.setter
    def on_give_up(self, callback: Callable[[str], None] | None) -> None:
        self.members.on_give_up = callback

    # -- bring-up -----------------------------------------------------------------------------
    async def start(
        self, client_for: Callable[[str], EngineClient] = GrpcEngineClient, inline: EngineClient | None = None
    ) -> None:
        """Load the tokenizers, connect the remote workers, start the local replicas of the
        versions that carry traffic (returns when every one has started or failed to; raises
        if no worker could start at all). `inline`: an in-process engine that serves the
        (single) version instead of a replica."""
        s = self.settings
        self.members.client_for = client_for
        await self.follower.poll_once()  # live state first: a rollout may have moved traffic
        if inline is not None:
            ((model_id, model),) = self.registry.fleet.models.items()
            ((name, _),) = model.versions.items()
            self.members.add_worker(model_id, name, INLINE_WORKER, inline)
        specs = runtime_specs(self.registry.fleet)  # an adapter version uses its base's tokenizer
        for model_id, model in self.registry.fleet.models.items():
            for name, version in model.versions.items():
                await asyncio.to_thread(self.runtimes.add, model_id, name, specs[(model_id, name)])
                for address in version.workers:
                    self.members.add_remote(model_id, name, address)
        # versions that carry traffic start now; one staged with traffic 0 starts when a
        # rollout (or an operator's weights) needs it (state/replica_plan.py)
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
        self._tasks += [
            loop.create_task(self.follower.run(), name="sluice-routing-follower"),
            loop.create_task(self._tick_forever(), name="sluice-fleet-ticker"),
            loop.create_task(self.autoscaler.run(), name="sluice-autoscaler"),
        ]

    # -- what the serving path asks -------------------------------------------------------------
    def version(self, model_id: str, version: str) -> VersionRuntime:
        return self.runtimes.get(model_id, version)

    def adapter_ref(self, model_id: str, version: str) -> AdapterRef | None:
        """The LoRA adapter a request of this version carries to its worker; None for weights (or a
        version gone since: an adapter unloaded while its last requests finish)."""
        model = self.registry.fleet.models.get(model_id)
        spec = model.versions.get(version) if model is not None else None
        return adapter_ref(model_id, spec) if spec is not None else None

    def parent_of(self, model_id: str) -> str | None:
        """The base model an adapter model runs on (its leading version's base), None for a model
        with weights: /v1/models' `parent`, as vLLM lists adapters."""
        version = self.leading_version(model_id)
        base = self.pool.base_of(model_id, version)
        return base[0] if base != (model_id, version) else None

    def leading_version(self, model_id: str) -> str:
        """The version most of the model's traffic goes to now (routing_state.leading_version)."""
        return leading_version(self.registry.model(model_id), self.follower.snapshot.model(model_id))

    def max_model_len(self, model_id: str, version: str) -> int:
        return self.runtimes.max_model_len(model_id, version)

    def model_window(self, model_id: str) -> int | None:
        return self.runtimes.model_window(model_id)

    def block_size(self, model_id: str, version: str) -> int:
        """The version's KV block size (prompt-cache accounting is in whole blocks)."""
        return self.router.engine_config(model_id, version).block_size

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

    def capacity(self) -> tuple[int, int]:
        """(KV token capacity, running-sequence capacity) of the workers that take requests: what
        the admission queue may keep in flight, and the denominator of the scaling signal."""
        tokens = seqs = 0
        for h in self.members.serving_handles():
            if h.stats is not None:
                tokens += h.stats.kv_blocks_total * h.stats.block_size
                seqs += h.stats.max_num_seqs or 0
        return tokens, seqs

    def scaling_signals(self) -> dict[str, float]:
        """model id -> its scaling signal (scaling/signal.py), for every model of the fleet: the
        `sluice_scaling_signal{model}` gauge, the autoscaler's numbers pooled per model."""
        # an adapter model scales nothing of its own: its work lands on its base's workers, whose
        # signal carries it (in flight on them, and its share of the queue)
        models = {
            m: list(model.versions)
            for m, model in self.registry.fleet.models.items()
            if not all(v.is_adapter for v in model.versions.values())
        }
        return model_signals(models, self.pool, self.handles.values(), self.demand())

    @property
    def ready(self) -> bool:
        """Some worker can take a request now."""
        return self.members.ready

    def not_ready_reason(self) -> str:
        return self.members.not_ready_reason()

    def worker_counts(self) -> dict[tuple[str, str, str], int]:
        return self.members.worker_counts()

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
        return fleet_status(
            self.registry,
            self.follower.snapshot,
            set(self.driver.rollouts),
            self.router.prefix_groups(),
            self.members,
            self.autoscaler.status(),
        )

    # -- a reloaded fleet file ------------------------------------------------------------------
    async def check_reload(self, new: FleetSpec) -> list[str]:
        """What makes the new file unfit for this running fleet (reload.py); empty when fit."""
        running = {(h.model_id, h.version) for h in self.handles.values()}
        return await check_reload(self.registry.fleet, new, running, self.runtimes.tokenizer_for)

    async def apply_reload(self) -> dict[str, list[str]]:
        """Bring the running fleet in step with the registry's (swapped) fleet; what changed."""
        changes = await apply_reload(self.registry.fleet, self.members, self.replicas, self.runtimes)
        if self.quota is None and has_quotas(self.registry.fleet):  # the first file with quotas
            self.quota = self.router.quota = make_quota_store(self.settings.limits_store, self.settings.redis_url)
        return changes

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
        await cancel_and_wait(self._tasks)
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
