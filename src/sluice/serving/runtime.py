"""What requests are served with: settings, the engine client, the tokenizer, gateway, safety,
replay log, metrics — built from Settings, and the serving state (loading, ready, draining).

The HTTP server answers /health at once; /ready and the generation routes wait for
`mark_ready()` (model loaded in the worker, tokenizer loaded here). A start-up failure is kept in
`startup_error` and reported by /ready, so an operator sees why.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Coroutine
from dataclasses import InitVar, dataclass, field
from typing import Any

from sluice.config import Settings
from sluice.gateway.authenticator import Authenticator, OpenAccess
from sluice.gateway.factory import build_gateway
from sluice.gateway.gateway import Gateway
from sluice.gateway.principal import Principal
from sluice.models.tokenizer import Tokenizer
from sluice.observability.metrics import ServingMetrics
from sluice.safety.pipeline import SafetyPipeline
from sluice.safety.policy import load_policy
from sluice.serving.errors import ErrorKind, ServingError
from sluice.streaming.replay_log import MemoryReplayLog, RedisReplayLog, ReplayLog
from sluice.worker.engine_client import EngineClient, ModelInfo
from sluice.worker.health_monitor import EngineHealth


@dataclass(slots=True, frozen=True)
class Ready:
    """The parts a request needs, all present (what `require_ready` hands out)."""

    engine: EngineClient
    tokenizer: Tokenizer
    info: ModelInfo


def build_replay(settings: Settings) -> ReplayLog:
    if settings.replay_store == "redis":
        return RedisReplayLog(settings.redis_url, settings.replay_ttl_s)
    return MemoryReplayLog(settings.replay_ttl_s, settings.replay_max_bytes)


@dataclass
class ServingRuntime:
    settings: Settings
    authenticator: Authenticator = field(default_factory=OpenAccess)
    metrics: ServingMetrics = field(default_factory=ServingMetrics)
    replay_log: InitVar[ReplayLog | None] = None  # default: built from the settings
    replay: ReplayLog = field(init=False)
    engine: EngineClient | None = None
    health: EngineHealth | None = None  # None: no monitor (a runtime built directly, in tests)
    gateway: Gateway | None = None
    safety: dict[str, SafetyPipeline] = field(default_factory=dict)  # "" = default; else per tier
    background_tasks: set[asyncio.Task] = field(default_factory=set)
    tokenizer: Tokenizer | None = None
    info: ModelInfo | None = None
    block_size: int = 0  # the engine's KV block size (its stats say; prompt-cache accounting)
    model_ids: tuple[str, ...] = ()
    created_at: float = field(default_factory=time.time)
    startup_error: str | None = None
    draining: bool = False
    drain_deadline: float = 0.0  # monotonic time by which open streams must end
    _ready: asyncio.Event = field(default_factory=asyncio.Event)

    def __post_init__(self, replay_log: ReplayLog | None) -> None:
        self.replay = replay_log or build_replay(self.settings)

    def mark_ready(
        self, engine: EngineClient, tokenizer: Tokenizer, info: ModelInfo, block_size: int, capacity_tokens: int = 0
    ) -> None:
        self.engine, self.tokenizer, self.info, self.block_size = engine, tokenizer, info, block_size
        if self.settings.safety and not self.safety:
            self.safety = build_safety(self.settings)
        if self.gateway is None:
            self.gateway = build_gateway(self.settings, self.settings.max_num_seqs, capacity_tokens or info.max_model_len)
        names = [self.settings.served_model_name or info.name, *self.settings.model_aliases]
        self.model_ids = tuple(dict.fromkeys(names))
        self._ready.set()

    @property
    def engine_available(self) -> bool:
        return self.health is None or self.health.available

    @property
    def ready(self) -> bool:
        return self._ready.is_set() and not self.draining and self.engine_available

    def not_ready_reason(self) -> str:
        if self.draining:
            return "draining"
        if self.startup_error:
            return "failed: " + self.startup_error
        if not self._ready.is_set():
            return "loading"
        return "unavailable: " + (self.health.detail if self.health is not None else "no engine")

    def begin_drain(self, grace_s: float) -> None:
        self.draining = True
        self.drain_deadline = time.monotonic() + grace_s

    def safety_for(self, principal: Principal) -> SafetyPipeline | None:
        return self.safety.get(principal.tier) or self.safety.get("")

    def check_model(self, model: str) -> None:
        """NOT_FOUND for a model id we do not serve."""
        if model not in self.model_ids:
            raise ServingError(ErrorKind.NOT_FOUND, f"model: {model}", code="model_not_found", param="model")

    def require_ready(self) -> Ready:
        """The engine, tokenizer and model info — or the refusal a caller should get now."""
        if self.draining:
            raise ServingError(ErrorKind.OVERLOADED, "the server is shutting down", retry_after_s=1)
        if not self._ready.is_set() or self.engine is None or self.tokenizer is None or self.info is None:
            if self.startup_error:
                raise ServingError(ErrorKind.INTERNAL, f"the model failed to load: {self.startup_error}")
            raise ServingError(ErrorKind.OVERLOADED, "the model is still loading", retry_after_s=2)
        if not self.engine_available:
            assert self.health is not None
            raise ServingError(ErrorKind.OVERLOADED, f"no engine is available: {self.health.detail}", retry_after_s=2)
        return Ready(self.engine, self.tokenizer, self.info)

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
