"""A scripted EngineClient for testing the serving pipeline without a model or a server.

Each request's reply is a list of steps: text to emit (one event per item), then a final
FinishReason; or an exception to raise at a point; or a hang. It records which requests were
closed before they finished (an abort, as a real engine client would do on `aclose`)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field

from sluice.engine.stats import EngineStats
from sluice.errors import AdapterError
from sluice.types import AdapterRef, FinishReason, GenerationEvent, GenerationRequest, Usage
from sluice.worker.engine_client import AdapterLoad, ModelInfo
from sluice.worker.warmup import is_warmup


@dataclass
class Script:
    texts: list[str] = field(default_factory=lambda: ["Hello", " world", "."])
    finish: FinishReason = FinishReason.EOS
    raise_at: int | None = None  # raise `error` before emitting texts[raise_at]
    error: BaseException | None = None
    hang_at: int | None = None  # block forever before emitting texts[hang_at]
    delay_s: float = 0.0  # between events
    cached_tokens: int = 0


class FakeEngine:
    def __init__(self, script: Script | None = None, max_model_len: int = 256):
        self.script = script or Script()
        self.info_ = ModelInfo("fake-model", max_model_len, 300)
        self.started: list[str] = []
        self.aborted: list[str] = []  # closed before their final event
        self.finished: list[str] = []
        self.requests: list[GenerationRequest] = []
        self.release = asyncio.Event()  # lets a hang go on
        self.up = True  # what ready() answers (a test takes the worker down)
        self.adapters: set[str] = set()  # LoRA adapters "resident" (names), reported in stats
        self.damaged: dict[str, str] = {}  # adapter source -> the AdapterError a load raises

    async def generate(self, request: GenerationRequest, trace_metadata=()) -> AsyncGenerator[GenerationEvent, None]:
        if is_warmup(request.request_id):  # the fleet's warm-up: one token, not counted
            yield GenerationEvent(
                request.request_id,
                "",
                [0],
                finished=True,
                finish_reason=FinishReason.LENGTH,
                usage=Usage(len(request.prompt_token_ids), 1, 0),
            )
            return
        s = self.script
        self.started.append(request.request_id)
        self.requests.append(request)
        if request.adapter is not None:  # a worker loads an adapter a request names
            self.adapters.add(request.adapter.name)
        n_prompt = len(request.prompt_token_ids)
        done = False
        try:
            for i, text in enumerate(s.texts):
                if s.raise_at == i:
                    assert s.error is not None
                    raise s.error
                if s.hang_at == i:
                    await self.release.wait()
                if s.delay_s:
                    await asyncio.sleep(s.delay_s)
                usage = Usage(n_prompt, i + 1, s.cached_tokens)
                last = i == len(s.texts) - 1
                if last:  # a consumer stops reading at the final event: it is not an abort
                    done = True
                    self.finished.append(request.request_id)
                yield GenerationEvent(
                    request.request_id, text, [i], finished=last, finish_reason=s.finish if last else None, usage=usage
                )
        finally:
            if not done:
                self.aborted.append(request.request_id)

    async def abort(self, request_id: str) -> None:
        self.aborted.append(request_id)

    async def stats(self) -> EngineStats:
        return EngineStats(block_size=8, kv_blocks_total=100, max_loras=8, lora_resident=sorted(self.adapters))

    async def load_adapter(self, adapter: AdapterRef) -> AdapterLoad:
        if adapter.source in self.damaged:
            raise AdapterError(self.damaged[adapter.source])
        self.adapters.add(adapter.name)
        return AdapterLoad(1 << 20, 0.01)

    async def unload_adapter(self, name: str) -> int:
        if name in self.adapters:
            self.adapters.discard(name)
            return 1
        return 0

    async def info(self) -> ModelInfo:
        return self.info_

    async def ready(self) -> bool:
        return self.up

    async def close(self) -> None:
        return None
