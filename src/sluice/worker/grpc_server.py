"""The worker's gRPC service around an AsyncEngine.

The server listens before the model is loaded: Health reports "loading" and Generate answers
UNAVAILABLE until `set_engine()`, so a supervisor can tell "starting" from "dead". A drain
(`start_drain()`) refuses new requests with UNAVAILABLE — the router retries them on
another worker, nothing has streamed yet — while the calls already running finish.
Each Generate response message carries every event the engine produced since the previous one
(`AsyncEngine.generate_batches`), so a slow consumer costs fewer, larger messages.
Cancelling the RPC (client gone, deadline passed) cancels the handler, whose generator exit
aborts the engine request: its KV blocks are freed within one engine step.
Stream serves many requests on one call (worker/stream_session.py): sluice's own gateway uses it,
so an engine step reaches the gateway as one message instead of one per request. Both serve each
request through `request_batches`: the same checks, span and errors (and a test's faults, when
the worker was started with some: worker/faults.py).
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from contextlib import aclosing

import grpc
from opentelemetry.trace import SpanKind

from sluice.engine.async_engine import AsyncEngine
from sluice.errors import EngineDeadError, InvalidRequestError
from sluice.request_context import request_id_var
from sluice.trace_context import extract_context, tracer
from sluice.types import GenerationEvent
from sluice.worker.convert import adapter_from_pb, event_to_pb, request_from_pb, stats_to_json
from sluice.worker.engine_client import ModelInfo
from sluice.worker.faults import RequestFaults
from sluice.worker.proto import engine_pb2 as pb
from sluice.worker.proto import engine_pb2_grpc as pb_grpc
from sluice.worker.status_codes import RequestFailed, status_for
from sluice.worker.stream_session import StreamSession

log = logging.getLogger("sluice.worker")


class EngineServicer(pb_grpc.EngineServicer):
    """Serves one AsyncEngine; starts without one (`set_engine` once the model is loaded)."""

    def __init__(self, faults: RequestFaults | None = None) -> None:
        self.faults = faults  # a testing aid (worker/faults.py), installed at start-up; None in production
        self.engine: AsyncEngine | None = None
        self.info: ModelInfo | None = None
        self.detail = "loading the model"
        self.draining = False
        self.active = 0  # requests running now, on any call (a drain waits for 0)
        self._sessions: set[StreamSession] = set()  # Stream calls open now

    def set_engine(self, engine: AsyncEngine, info: ModelInfo) -> None:
        self.engine, self.info, self.detail = engine, info, "ready"

    def set_failed(self, detail: str) -> None:
        self.detail = f"failed: {detail}"

    def start_drain(self) -> None:
        self.draining, self.detail = True, "draining"

    def end_streams(self) -> None:
        """The worker stops: each Stream call ends as soon as its requests have (see worker_main)."""
        for session in self._sessions:
            session.end_when_idle()

    def _serving_engine(self) -> AsyncEngine:
        """The engine, or RequestFailed (UNAVAILABLE) saying why none serves."""
        engine = self.engine
        if engine is None:
            raise RequestFailed(grpc.StatusCode.UNAVAILABLE, f"engine not ready ({self.detail})")
        if not engine.is_running:  # shutting down, or its loop died
            raise RequestFailed(grpc.StatusCode.UNAVAILABLE, "engine stopped")
        return engine

    async def _require_engine(self, context: grpc.aio.ServicerContext) -> AsyncEngine:
        try:
            return self._serving_engine()
        except RequestFailed as failed:
            await context.abort(failed.code, failed.details)
            raise AssertionError("unreachable: abort() raises") from None

    async def Generate(
        self, request: pb.GenerateRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.GenerateResponse]:
        try:
            async with aclosing(self.request_batches(request, context.invocation_metadata())) as batches:
                async for batch in batches:
                    yield pb.GenerateResponse(events=[event_to_pb(e) for e in batch])
        except RequestFailed as failed:
            if failed.trailers:
                context.set_trailing_metadata(failed.trailers)
            await context.abort(failed.code, failed.details)

    async def Stream(
        self, request_iterator: AsyncIterator[pb.StreamRequest], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.StreamResponse]:
        session = StreamSession(self.request_batches)
        self._sessions.add(session)
        try:
            async with aclosing(session.serve(request_iterator)) as responses:
                async for response in responses:
                    yield response
        finally:
            self._sessions.discard(session)

    async def request_batches(
        self, request: pb.GenerateRequest, trace_metadata: Sequence[tuple[str, str | bytes]] | None
    ) -> AsyncGenerator[list[GenerationEvent], None]:
        """One request's events, batched as the engine delivers them: what Generate and each
        request of a Stream call serve. Raises RequestFailed with the status to answer."""
        engine = self._serving_engine()
        if self.draining:
            raise RequestFailed(grpc.StatusCode.UNAVAILABLE, "worker draining")
        request_id_var.set(request.request_id)  # this handler's task: its log lines carry the id
        span = tracer().start_span(
            "worker.generate",
            context=extract_context(trace_metadata),
            kind=SpanKind.SERVER,
            attributes={
                "sluice.request_id": request.request_id,
                "sluice.prompt_tokens": len(request.prompt_token_ids),
                "sluice.resumed_tokens": len(request.resumed_output_ids),
            },
        )
        started = time.perf_counter()
        first_at: float | None = None
        last: GenerationEvent | None = None
        self.active += 1
        try:
            batches = engine.generate_batches(request_from_pb(request))
            if self.faults is not None:
                batches = self.faults.around(request.request_id, batches)
            async for batch in batches:
                if first_at is None and any(e.token_ids for e in batch):
                    first_at = time.perf_counter()
                    queued = next((e.queue_time_s for e in batch if e.queue_time_s is not None), None)
                    if queued is not None:
                        span.set_attribute("sluice.queue_time_s", queued)
                last = batch[-1]
                yield batch
        except (InvalidRequestError, EngineDeadError) as exc:
            code, trailers = status_for(exc)
            raise RequestFailed(code, str(exc), trailers) from None
        finally:
            self.active -= 1
            end = time.perf_counter()
            if first_at is not None:  # prefill ≈ until the first token (queue time included above)
                span.set_attributes({"sluice.prefill_s": first_at - started, "sluice.decode_s": end - first_at})
            if last is not None:
                span.set_attributes(
                    {
                        "sluice.output_tokens": last.usage.output_tokens,
                        "sluice.cached_tokens": last.usage.cached_tokens,
                        "sluice.finish_reason": last.finish_reason.value if last.finish_reason else "none",
                    }
                )
            span.end()

    async def Abort(self, request: pb.AbortRequest, context: grpc.aio.ServicerContext) -> pb.AbortResponse:
        engine = await self._require_engine(context)
        engine.abort(request.request_id)
        return pb.AbortResponse()

    async def Stats(self, request: pb.StatsRequest, context: grpc.aio.ServicerContext) -> pb.StatsResponse:
        engine = await self._require_engine(context)
        return pb.StatsResponse(stats_json=stats_to_json(engine.stats()))

    async def Info(self, request: pb.InfoRequest, context: grpc.aio.ServicerContext) -> pb.InfoResponse:
        await self._require_engine(context)
        assert self.info is not None
        return pb.InfoResponse(
            name=self.info.name, max_model_len=self.info.max_model_len, vocab_size=self.info.vocab_size
        )

    async def LoadAdapter(self, request: pb.AdapterRequest, context: grpc.aio.ServicerContext) -> pb.AdapterResponse:
        engine = await self._require_engine(context)
        try:
            adapter = adapter_from_pb(request.name, request.source)
            if adapter is None:
                raise InvalidRequestError("LoadAdapter needs a name and a source")
            size, seconds = await engine.load_adapter(adapter)
        except InvalidRequestError as exc:  # AdapterError included: a damaged adapter, nothing else harmed
            code, trailers = status_for(exc)
            context.set_trailing_metadata(trailers)
            await context.abort(code, str(exc))
        return pb.AdapterResponse(bytes=size, load_s=seconds)

    async def UnloadAdapter(self, request: pb.AdapterRequest, context: grpc.aio.ServicerContext) -> pb.AdapterResponse:
        engine = await self._require_engine(context)
        return pb.AdapterResponse(unloaded=engine.unload_adapter(request.name))

    async def Health(self, request: pb.HealthRequest, context: grpc.aio.ServicerContext) -> pb.HealthResponse:
        if self.engine is None:
            return pb.HealthResponse(ready=False, detail=self.detail)  # loading, or failed
        if not self.engine.is_running:
            return pb.HealthResponse(ready=False, detail="engine stopped")
        if self.draining:
            return pb.HealthResponse(ready=False, detail="draining")
        return pb.HealthResponse(ready=True, detail="ready")
