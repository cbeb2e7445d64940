"""`InProcessEngineClient`: the EngineClient straight onto an AsyncEngine in this process
(tests, benchmarks, and `sluice serve --worker inline`)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Sequence

from sluice.engine.async_engine import AsyncEngine
from sluice.engine.stats import EngineStats
from sluice.errors import EngineDeadError, EngineUnavailableError
from sluice.types import AdapterRef, GenerationEvent, GenerationRequest
from sluice.worker.engine_client import AdapterLoad, ModelInfo


class InProcessEngineClient:
    """`engine`: a started AsyncEngine; `info`: what `info()` reports. `close()` shuts the engine down."""

    def __init__(self, engine: AsyncEngine, info: ModelInfo):
        self.engine = engine
        self._info = info

    async def generate(
        self, request: GenerationRequest, trace_metadata: Sequence[tuple[str, str]] = ()
    ) -> AsyncGenerator[GenerationEvent, None]:
        try:
            async for event in self.engine.generate(request):
                yield event
        except EngineDeadError as exc:
            raise EngineUnavailableError(str(exc)) from None

    async def abort(self, request_id: str) -> None:
        self.engine.abort(request_id)

    async def stats(self) -> EngineStats:
        return self.engine.stats()

    async def info(self) -> ModelInfo:
        return self._info

    async def ready(self) -> bool:
        return self.engine.is_running

    async def load_adapter(self, adapter: AdapterRef) -> AdapterLoad:
        return AdapterLoad(*await self.engine.load_adapter(adapter))

    async def unload_adapter(self, name: str) -> int:
        return self.engine.unload_adapter(name)

    async def close(self) -> None:
        # shutdown() joins the engine thread (up to a step): off the event loop
        await asyncio.to_thread(self.engine.shutdown)
