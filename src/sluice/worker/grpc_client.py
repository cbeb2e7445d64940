"""`GrpcEngineClient`: the EngineClient over gRPC to a `sluice worker` (local or remote).

By default every request travels over one Stream call per client (worker/stream_mux.py), so
an engine step reaches the gateway as one message; `multiplex=False` uses a Generate call per
request. Status codes map back to sluice errors: INVALID_ARGUMENT → InvalidRequestError (or
ContextWindowExceededError, from trailing metadata), anything that means "no engine" →
EngineUnavailableError. Leaving `generate()` early cancels the call; the worker aborts the
request. The channel is created lazily so it binds to the event loop that uses it.
Imports no torch: a gateway-only process (`sluice serve --worker ADDR`) needs none.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from typing import Any

import grpc

from sluice.engine.stats import EngineStats
from sluice.errors import EngineUnavailableError, InvalidRequestError, SluiceError
from sluice.types import AdapterRef, GenerationEvent, GenerationRequest
from sluice.worker.channel_options import CLIENT_OPTIONS
from sluice.worker.convert import event_from_pb, request_to_pb, stats_from_json
from sluice.worker.engine_client import AdapterLoad, ModelInfo
from sluice.worker.proto import engine_pb2 as pb
from sluice.worker.proto import engine_pb2_grpc as pb_grpc
from sluice.worker.status_codes import error_from
from sluice.worker.stream_mux import StreamMux, StreamUnsupportedError

log = logging.getLogger("sluice.worker")


class GrpcEngineClient:
    """`address`: host:port or unix:/path. `request_timeout_s`: default deadline of one request
    (None: no deadline). `options`: extra gRPC channel options, appended to the defaults.
    `multiplex`: send every request over one Stream call (the default; worker/stream_mux.py),
    or each over a Generate call of its own (benchmarks compare the two). A worker without
    Stream (older than it) turns it off by itself, on the first request."""

    def __init__(
        self,
        address: str,
        request_timeout_s: float | None = None,
        options: Sequence[tuple[str, Any]] = (),
        multiplex: bool = True,
    ):
        self.address = address
        self.request_timeout_s = request_timeout_s
        self.multiplex = multiplex
        self._options = [*CLIENT_OPTIONS, *options]
        self._channel: grpc.aio.Channel | None = None
        self._stub: pb_grpc.EngineStub | None = None
        self._mux: StreamMux | None = None
        self._active: set[Any] = set()  # Generate calls in flight
        self._abandoned: dict[Any, str] = {}  # call -> why it was given up (abandon_calls)

    def _get_stub(self) -> pb_grpc.EngineStub:
        if self._stub is None:
            self._channel = grpc.aio.insecure_channel(self.address, options=self._options)
            self._stub = pb_grpc.EngineStub(self._channel)
        return self._stub

    def _get_mux(self) -> StreamMux:
        if self._mux is None:
            stub = self._get_stub()
            self._mux = StreamMux(lambda requests: stub.Stream(requests))
        return self._mux

    async def generate(
        self, request: GenerationRequest, trace_metadata: Sequence[tuple[str, str]] = (), timeout_s: float | None = None
    ) -> AsyncGenerator[GenerationEvent, None]:
        """Stream the request's events. `timeout_s`: this call's deadline in seconds (default
        `request_timeout_s`); when it passes the worker aborts the request and this raises
        EngineUnavailableError."""
        try:
            wire_request = request_to_pb(request)
        except (ValueError, TypeError) as exc:  # e.g. a value outside the wire's int32 range
            raise InvalidRequestError(f"request cannot be encoded: {exc}") from None
        if self.multiplex:
            try:
                async for event in self._generate_on_stream(
                    request.request_id, wire_request, trace_metadata, timeout_s or self.request_timeout_s
                ):
                    yield event
                return
            except StreamUnsupportedError:  # an older worker, before any event: Generate from now on
                log.warning("worker %s has no Stream method: one Generate call per request from now on", self.address)
                self.multiplex = False
        call = self._get_stub().Generate(
            wire_request, timeout=timeout_s or self.request_timeout_s, metadata=tuple(trace_metadata) or None
        )
        self._active.add(call)
        finished = False
        try:
            async for message in call:
                for event in message.events:
                    ev = event_from_pb(request.request_id, event)
                    finished = finished or ev.finished
                    yield ev
                if finished:
                    return
            if not finished:
                raise EngineUnavailableError("the worker closed the stream before the request finished")
        except grpc.aio.AioRpcError as exc:
            raise error_from(exc) from None
        except asyncio.CancelledError:
            # grpc.aio raises CancelledError for a call cancelled locally; when that was
            # abandon_calls() (the worker was declared down) and not this task's own cancellation,
            # it is an unavailable engine — the caller retries or migrates the request
            task = asyncio.current_task()
            why = self._abandoned.get(call)
            if why is not None and (task is None or not task.cancelling()):
                raise EngineUnavailableError(f"the worker was given up: {why}") from None
            raise
        finally:
            self._active.discard(call)
            self._abandoned.pop(call, None)
            if not finished:
                call.cancel()  # the worker sees the cancellation and aborts the request

    async def _generate_on_stream(
        self,
        request_id: str,
        wire_request: pb.GenerateRequest,
        trace_metadata: Sequence[tuple[str, str]],
        timeout_s: float | None,
    ) -> AsyncIterator[GenerationEvent]:
        mux = self._get_mux()
        stream_id, queue = mux.start(wire_request, trace_metadata, timeout_s)
        finished = False
        try:
            while not finished:
                item = await queue.get()
                if isinstance(item, SluiceError):
                    finished = True  # the request is over on the worker's side
                    raise item
                for event in item:
                    ev = event_from_pb(request_id, event)
                    finished = finished or ev.finished
                    yield ev
        finally:
            if not finished:
                mux.cancel(stream_id)  # the worker aborts the request

    def abandon_calls(self, why: str) -> int:
        """Fail every request in flight with EngineUnavailableError (the worker stopped
        answering: a hang is found by the health deadline, not by a broken connection)."""
        calls = list(self._active)
        for call in calls:
            self._abandoned[call] = why
            call.cancel()
        return len(calls) + (self._mux.abandon(why) if self._mux is not None else 0)

    async def _unary(self, method: str, request: object, timeout_s: float = 5.0) -> Any:  # the method's reply message
        try:
            return await getattr(self._get_stub(), method)(request, timeout=timeout_s)
        except grpc.aio.AioRpcError as exc:
            raise error_from(exc) from None

    async def abort(self, request_id: str) -> None:
        await self._unary("Abort", pb.AbortRequest(request_id=request_id))

    async def stats(self) -> EngineStats:
        reply = await self._unary("Stats", pb.StatsRequest())
        return stats_from_json(reply.stats_json)

    async def info(self) -> ModelInfo:
        r = await self._unary("Info", pb.InfoRequest())
        return ModelInfo(name=r.name, max_model_len=r.max_model_len, vocab_size=r.vocab_size)

    async def load_adapter(self, adapter: AdapterRef, timeout_s: float = 120.0) -> AdapterLoad:
        """A load reads the adapter (an S3 fetch included), hence the long default deadline."""
        reply = await self._unary("LoadAdapter", pb.AdapterRequest(name=adapter.name, source=adapter.source), timeout_s)
        return AdapterLoad(reply.bytes, reply.load_s)

    async def unload_adapter(self, name: str) -> int:
        reply = await self._unary("UnloadAdapter", pb.AdapterRequest(name=name))
        return reply.unloaded

    async def health(self, timeout_s: float = 2.0) -> tuple[bool, str]:
        reply = await self._unary("Health", pb.HealthRequest(), timeout_s=timeout_s)
        return reply.ready, reply.detail

    async def ready(self) -> bool:
        try:
            return (await self.health())[0]
        except EngineUnavailableError:
            return False

    async def close(self) -> None:
        if self._mux is not None:
            await self._mux.close()
            self._mux = None
        if self._channel is not None:
            await self._channel.close()
            self._channel, self._stub = None, None
