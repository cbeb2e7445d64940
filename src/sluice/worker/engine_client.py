"""`EngineClient`: the one interface the API and gateway use to reach an engine.

Why an interface: `sluice serve` runs the engine in a worker process (the model must not share
the GIL with the HTTP loop) and a gateway may reach remote workers; tests and benchmarks may run
it in-process. Callers see the same contract either way:

- `generate()` streams `GenerationEvent`s; the last one has `finished=True`. A bad request raises
  `InvalidRequestError` before any event; an unreachable or dead engine raises
  `EngineUnavailableError`. Leaving the iterator early (client disconnect, cancellation) aborts
  the request, and the engine frees its KV blocks within one step.
- Token ids go in (the API process tokenizes and applies the chat template once); text comes out
  (detokenization and stop sequences stay with the engine, which sees every token).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from sluice.engine.stats import EngineStats
from sluice.types import AdapterRef, GenerationEvent, GenerationRequest


@dataclass(slots=True, frozen=True)
class ModelInfo:
    """What a caller needs to know about the model behind an engine."""

    name: str  # the served model id (what /v1/models lists)
    max_model_len: int  # prompt + output tokens must fit in this
    vocab_size: int


@dataclass(slots=True, frozen=True)
class AdapterLoad:
    """A LoRA adapter made resident on an engine: its weights' memory and the load's time (0 when
    it was resident already)."""

    bytes: int
    load_s: float


@runtime_checkable
class EngineClient(Protocol):
    def generate(
        self, request: GenerationRequest, trace_metadata: Sequence[tuple[str, str]] = ()
    ) -> AsyncGenerator[GenerationEvent, None]:
        """Stream the request's events (an async generator); see the module docstring.
        `trace_metadata`: the caller's trace context (W3C traceparent), for the engine's span."""
        ...

    async def abort(self, request_id: str) -> None:
        """Abort a running or queued request; unknown ids are ignored."""
        ...

    async def stats(self) -> EngineStats:
        """The engine's latest statistics snapshot."""
        ...

    async def info(self) -> ModelInfo: ...

    async def ready(self) -> bool:
        """True once the model is loaded and the engine loop runs."""
        ...

    async def load_adapter(self, adapter: AdapterRef) -> AdapterLoad:
        """Load (and check) a LoRA adapter ahead of its requests; AdapterError naming what is
        wrong with a damaged one, the engine unchanged."""
        ...

    async def unload_adapter(self, name: str) -> int:
        """Drop the engine's resident adapters of that name; how many."""
        ...

    async def close(self) -> None: ...
