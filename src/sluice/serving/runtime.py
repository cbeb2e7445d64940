"""What requests are served with: settings, the fleet (workers, router), gateway, safety,
replay log, metrics — built from Settings, and the serving state (loading, ready, draining).

The HTTP server answers /health at once; /ready and the generation routes wait for
`mark_ready()` (the fleet started: its local workers loaded, its tokenizers loaded here). A
start-up failure is kept in `startup_error` and reported by /ready, so an operator sees why.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine
from dataclasses import InitVar, dataclass, field
from typing import Any

from sluice.config import Settings, StoreKind
from sluice.gateway.admission import AdmissionQueue
from sluice.gateway.authenticator import Authenticator, OpenAccess
from sluice.gateway.factory import build_gateway
from sluice.gateway.gateway import Gateway
from sluice.gateway.principal import Principal
from sluice.gateway.tiers import load_tiers
from sluice.observability.metrics import ServingMetrics
from sluice.routing.errors import UnknownModelError
from sluice.routing.fleet.fleet import Fleet
from sluice.routing.scaling.observation import Demand
from sluice.safety.pipeline import SafetyPipeline
from sluice.safety.policy import load_policy
from sluice.serving.errors import ErrorKind, ServingError
from sluice.serving.idempotency.retries import Idempotency, build_idempotency
from sluice.streaming.replay_log import MemoryReplayLog, RedisReplayLog, ReplayLog


def batch_band(settings: Settings) -> int:
    """The admission band of batch work (the `batch` tier's; past every band without one)."""
    tiers = load_tiers(settings.tiers)
    return tiers["batch"].priority if "batch" in tiers else max(t.priority for t in tiers.values()) + 1


def queue_demand(queue: AdmissionQueue, band: int) -> Callable[[], Demand]:
    """What the autoscaler and the exported scaling signal read of the admission queue (routing
    cannot import it)."""
    return lambda: Demand(queue.queued_tokens, queue.queued_tokens_from_band(band))


def build_replay(settings: Settings) -> ReplayLog:
    if settings.replay_store is StoreKind.REDIS:
        return RedisReplayLog(settings.redis_url, settings.replay_ttl_s)
    return MemoryReplayLog(settings.replay_ttl_s, settings.replay_max_bytes)


@dataclass
class ServingRuntime:
    settings: Settings
    authenticator: Authenticator = field(default_factory=OpenAccess)
    metrics: ServingMetrics = field(default_factory=ServingMetrics)
    replay_log: InitVar[ReplayLog | None] = None  # default: built from the settings
    replay: ReplayLog = field(init=False)
    idempotency: Idempotency = field(init=False)  # Idempotency-Key claims and kept replies
    fleet: Fleet | None = None  # the workers, the router, their state (routing/fleet/fleet.py)
    gateway: Gateway | None = None
    safety: dict[str, SafetyPipeline] = field(default_factory=dict)  # "" = default; else per tier
    background_tasks: set[asyncio.Task] = field(default_factory=set)
    created_at: float = field(default_factory=time.time)
    startup_error: str | None = None
    draining: bool = False
    drain_deadline: float = 0.0  # monotonic time by which open streams must end
    _ready: asyncio.Event = field(default_factory=asyncio.Event)

    def __post_init__(self, replay_log: ReplayLog | None) -> None:
        self.replay = replay_log or build_replay(self.settings)
        self.idempotency = build_idempotency(self.settings, self.replay)

    def mark_ready(self, fleet: Fleet, capacity_tokens: int = 0) -> None:
        self.fleet = fleet
        if self.settings.safety and not self.safety:
            self.safety = build_safety(self.settings)
        if self.gateway is None:
            self.gateway = build_gateway(self.settings, self.settings.max_num_seqs, capacity_tokens or 1)
        fleet.demand = queue_demand(self.gateway.admission, batch_band(self.settings))
        self._ready.set()

    @property
    def model_ids(self) -> tuple[str, ...]:
        """Every id a client may send (model ids, then aliases)."""
        return tuple(self.fleet.registry.served_names()) if self.fleet is not None else ()

    @property
    def engine_available(self) -> bool:
        return self.fleet is not None and self.fleet.ready

    @property
    def ready(self) -> bool:
        return self._ready.is_set() and not self.draining and self.engine_available

    def not_ready_reason(self) -> str:
        if self.draining:
            return "draining"
        if self.startup_error:
            return "failed: " + self.startup_error
        if not self._ready.is_set() or self.fleet is None:
            return "loading"
        return "unavailable: " + self.fleet.not_ready_reason()

    def begin_drain(self, grace_s: float) -> None:
        self.draining = True
        self.drain_deadline = time.monotonic() + grace_s

    def safety_for(self, principal: Principal) -> SafetyPipeline | None:
        return self.safety.get(principal.tier) or self.safety.get("")

    def check_model(self, model: str) -> str:
        """The canonical id of a model id or alias we serve (NOT_FOUND otherwise)."""
        fleet = self.require_fleet()
        try:
            return fleet.registry.resolve(model)
        except UnknownModelError:
            raise ServingError(ErrorKind.NOT_FOUND, f"model: {model}", code="model_not_found", param="model") from None

    def require_fleet(self) -> Fleet:
        """The fleet once started (it may have no ready worker right now)."""
        if self.draining:
            raise ServingError(ErrorKind.OVERLOADED, "the server is shutting down", retry_after_s=1)
        if not self._ready.is_set() or self.fleet is None:
            if self.startup_error:
                raise ServingError(ErrorKind.INTERNAL, f"the model failed to load: {self.startup_error}")
            raise ServingError(ErrorKind.OVERLOADED, "the model is still loading", retry_after_s=2)
        return self.fleet

    def require_ready(self) -> Fleet:
        """The fleet, with some worker able to take a request — or the refusal a caller should
        get now (529 before any stream opens)."""
        fleet = self.require_fleet()
        if not fleet.ready:
            raise ServingError(
                ErrorKind.OVERLOADED, f"no engine is available: {fleet.not_ready_reason()}", retry_after_s=2
            )
        return fleet

    def keep(self, task: asyncio.Task) -> None:
        """Hold a reference to a detached task (background generation, a batch) until it ends:
        the event loop keeps only weak references to tasks."""
        self.background_tasks.add(task)
        task.add_done_callback(self.background_tasks.discard)

    def keep_task(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task:
        task = asyncio.get_running_loop().create_task(coro)
        self.keep(task)
        return task


def build_safety(settings: Settings) -> dict[str, SafetyPipeline]:
    """One pipeline per policy file; tiers naming the same file share it (and its classifier)."""
    by_file: dict[str | None, SafetyPipeline] = {}

    def pipeline(path: str | None) -> SafetyPipeline:
        if path not in by_file:
            by_file[path] = SafetyPipeline(load_policy(path))
        return by_file[path]

    out = {"": pipeline(settings.safety_policy)}
    for tier, path in settings.safety_tier_policies.items():
        out[tier] = pipeline(path)
    return out
