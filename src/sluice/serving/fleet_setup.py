"""The fleet behind `sluice serve`, built from Settings: from the fleet file (`--fleet FILE`), or
the fleet of one today's settings describe (one model, one version: a spawned and supervised
local worker, a remote `--worker ADDR`, or `--worker inline`)."""

from __future__ import annotations

from typing import Any

from sluice.config import Settings
from sluice.config.lora import parse_lora_module
from sluice.engine.config import EngineConfig
from sluice.routing.fleet.fleet import Fleet
from sluice.routing.fleet_file.default_fleet import INLINE, fleet_from_settings
from sluice.routing.fleet_file.registry import Registry
from sluice.worker.engine_client import EngineClient, ModelInfo

# Fleet is named here for the API's start-up code (api/serve_main.py), which holds the started
# fleet but imports nothing below serving
__all__ = ["Fleet", "build_registry", "inline_engine", "start_fleet"]


def build_registry(settings: Settings, known_tiers: list[str]) -> Registry:
    """Raises FleetFileError naming every problem of a bad fleet file (start-up stops)."""
    if settings.fleet:
        from sluice.routing.fleet_file.loader import load_fleet

        return Registry(load_fleet(settings.fleet, known_tiers=known_tiers), settings.fleet)
    return Registry(fleet_from_settings(settings))


async def start_fleet(settings: Settings, registry: Registry) -> Fleet:
    fleet = Fleet.build(settings, registry)
    inline = await inline_engine(settings) if settings.worker == INLINE and not settings.fleet else None
    await fleet.start(inline=inline)
    await register_lora_modules(fleet, settings)
    return fleet


async def register_lora_modules(fleet: Fleet, settings: Settings) -> None:
    """`--lora-modules NAME=PATH ...`: each adapter checked by a worker of the fleet's base model
    and served as model NAME, before the server reports ready (a damaged one stops start-up with
    the worker's words). They are run-time adapters: /v1/unload_lora_adapter may remove them."""
    for item in settings.lora_modules:
        name, path = parse_lora_module(item)
        try:
            await fleet.adapters.load(name, path)
        except Exception as exc:
            raise ValueError(f"--lora-modules {name}={path}: {exc}") from None


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
        holder["loaded"] = load_model(settings.model, settings.dtype, device=config.device, kernels=config.kernels)
        return LLMEngine(holder["loaded"], config)

    engine = AsyncEngine(factory=build).start()
    llm = await engine.wait_loaded()
    loaded = holder["loaded"]
    info = ModelInfo(served_name(loaded.path), llm.max_model_len, loaded.tokenizer.vocab_size)
    return InProcessEngineClient(engine, info)
