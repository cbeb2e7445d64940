"""The engine behind `sluice serve`, built from Settings: spawned (and supervised), remote, or
inline; with the health monitor that tells /ready and admission whether it can serve."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sluice.config import Settings
from sluice.engine.config import EngineConfig
from sluice.worker.engine_client import EngineClient, ModelInfo
from sluice.worker.grpc_client import GrpcEngineClient
from sluice.worker.health_monitor import EngineHealth, Probe
from sluice.worker.restart_policy import RestartPolicy
from sluice.worker.spawn import engine_argv
from sluice.worker.supervisor import WorkerSupervisor


@dataclass(slots=True)
class EngineConnection:
    client: EngineClient
    health: EngineHealth
    supervisor: WorkerSupervisor | None = None  # a spawned worker's (restarts it)

    async def close(self) -> None:
        await self.health.stop()
        if self.supervisor is not None:
            await self.supervisor.stop()
        await self.client.close()


async def connect_engine(settings: Settings, say: Callable[[str], None]) -> EngineConnection:
    """The engine client, its health monitor (not yet started) and, for a spawned worker, the
    supervisor that restarts it (not yet watching). Returns once the engine is ready."""

    def monitor(probe: Probe) -> EngineHealth:
        return EngineHealth(probe, settings.health_check_interval_s, settings.health_check_timeout_s)

    if settings.worker == "inline":
        client = await inline_engine(settings)

        async def inline_probe() -> tuple[bool, str]:
            ready = await client.ready()
            return ready, "ready" if ready else "the engine loop stopped"

        return EngineConnection(client, monitor(inline_probe))
    if settings.worker:
        remote = GrpcEngineClient(settings.worker)
        deadline = time.monotonic() + settings.worker_start_timeout_s
        while not await remote.ready():
            if time.monotonic() > deadline:
                raise RuntimeError(f"the worker at {settings.worker} is not ready")
            await asyncio.sleep(0.5)
        return EngineConnection(remote, monitor(lambda: remote.health(timeout=settings.health_check_timeout_s)))
    policy = RestartPolicy(settings.worker_max_restarts, settings.worker_restart_window_s)
    supervisor = WorkerSupervisor(
        settings.model, settings.dtype, engine_argv(settings), settings.worker_start_timeout_s, policy
    )
    try:
        local = await supervisor.start(GrpcEngineClient)
    except BaseException:
        await supervisor.stop()
        raise
    say(f"engine worker ready (pid {supervisor.worker.pid if supervisor.worker else '?'})")
    health = monitor(lambda: local.health(timeout=settings.health_check_timeout_s))
    supervisor.health = health
    return EngineConnection(local, health, supervisor)


async def inline_engine(settings: Settings) -> EngineClient:
    """The engine in this process (`--worker inline`, debugging): torch is imported only here."""
    from sluice.engine.async_engine import AsyncEngine
    from sluice.engine.engine import LLMEngine
    from sluice.models.loader import load_model
    from sluice.worker.in_process import InProcessEngineClient
    from sluice.worker.worker_main import served_name

    config = EngineConfig.from_settings(settings)
    holder: dict[str, Any] = {}

    def build() -> LLMEngine:  # on the engine thread (see AsyncEngine on OpenMP pools)
        holder["loaded"] = load_model(settings.model, settings.dtype)
        return LLMEngine(holder["loaded"], config)

    engine = AsyncEngine(factory=build).start()
    llm = await engine.wait_loaded()
    loaded = holder["loaded"]
    info = ModelInfo(served_name(loaded.path), llm.max_model_len, loaded.tokenizer.vocab_size)
    return InProcessEngineClient(engine, info)
