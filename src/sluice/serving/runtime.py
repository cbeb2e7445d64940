"""What the HTTP app serves with: settings, the engine client, the tokenizer, metrics, state.

The app starts answering /health at once; /ready and the generation routes wait for
`mark_ready()` (model loaded in the worker, tokenizer loaded here). A start-up failure is
kept in `startup_error` and reported by /ready, so an operator sees why.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from sluice.api.auth import Authenticator, OpenAccess
from sluice.api.errors import ApiError, retry_headers
from sluice.streaming.replay_log import MemoryReplayLog, RedisReplayLog, ReplayLog
from sluice.config import Settings
from sluice.gateway.gateway import Gateway
from sluice.gateway.principal import Principal
from sluice.safety.pipeline import SafetyPipeline
from sluice.models.tokenizer import Tokenizer
from sluice.observability.metrics import ServingMetrics
from sluice.worker.engine_client import EngineClient, ModelInfo
from sluice.worker.health_monitor import EngineHealth


@dataclass
class ServingRuntime:
    settings: Settings
    authenticator: Authenticator = field(default_factory=OpenAccess)
    metrics: ServingMetrics = field(default_factory=ServingMetrics)
    engine: EngineClient | None = None
    health: EngineHealth | None = None  # None: no monitor (tests that build the runtime directly)
    gateway: Gateway | None = None
    safety: dict[str, SafetyPipeline] = field(default_factory=dict)  # "" = default; else per tier
    replay: ReplayLog = None  # type: ignore[assignment]  # set in __post_init__
    background_tasks: set = field(default_factory=set)
    tokenizer: Tokenizer | None = None
    info: ModelInfo | None = None
    block_size: int = 16
    model_ids: tuple[str, ...] = ()
    created_at: float = field(default_factory=time.time)
    startup_error: str | None = None
    draining: bool = False
    drain_deadline: float = 0.0  # monotonic time by which open streams must end
    _ready: asyncio.Event = field(default_factory=asyncio.Event)

    def __post_init__(self) -> None:
        if self.replay is None:
            s = self.settings
            if s.replay_store == "redis":
                self.replay = RedisReplayLog(s.redis_url, s.replay_ttl_s)
            else:
                self.replay = MemoryReplayLog(s.replay_ttl_s, s.replay_max_bytes)

    def mark_ready(
        self, engine: EngineClient, tokenizer: Tokenizer, info: ModelInfo, block_size: int, capacity_tokens: int = 0
    ) -> None:
        from sluice.gateway.factory import build_gateway

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
        """404 for a model id we do not serve (reference §2: unknown model → not_found_error)."""
        if model not in self.model_ids:
            raise ApiError(404, f"model: {model}", type="not_found_error")

    def require_ready(self) -> tuple[EngineClient, Tokenizer, ModelInfo]:
        if self.draining:
            raise ApiError(529, "the server is shutting down", headers=retry_headers(1))
        if not self._ready.is_set() or self.engine is None or self.tokenizer is None or self.info is None:
            msg = f"the model failed to load: {self.startup_error}" if self.startup_error else "the model is still loading"
            raise ApiError(529 if not self.startup_error else 500, msg, headers=retry_headers(2))
        if not self.engine_available:
            assert self.health is not None
            raise ApiError(529, f"no engine is available: {self.health.detail}", headers=retry_headers(2))
        return self.engine, self.tokenizer, self.info


def build_safety(settings: Settings) -> dict[str, SafetyPipeline]:
    """One pipeline per policy file; tiers naming the same file share it (and its classifier)."""
    from sluice.safety.policy import load_policy

    by_file: dict[str | None, SafetyPipeline] = {}

    def pipeline(path: str | None) -> SafetyPipeline:
        if path not in by_file:
            by_file[path] = SafetyPipeline(load_policy(path))
        return by_file[path]

    out = {"": pipeline(settings.safety_policy)}
    for tier, path in settings.safety_tier_policies.items():
        out[tier] = pipeline(path)
    return out
