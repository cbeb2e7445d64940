"""One Stream call on the worker: many requests over one gRPC call (the server's side).

Why: with a Generate call per request, every engine step made one gRPC message per running
request, each a write and a wake-up in the worker and in the gateway, taking the two cores from
the engine's threads (docs/BENCHMARKS.md, "The gRPC hop"). Here each request runs as a task of
its own, as a Generate handler did, but their outputs go to one outbox, and the call writes
whatever the outbox holds as one message: the tasks an engine step wakes all run before the
writer does, so a step's events for every request leave together.

The client starts requests (`StreamStart`, its own id for each) and cancels them (`cancels`). A
request's failure is a RequestOutput with a status, answered exactly as Generate would have
ended its call; a start's `timeout_s` passing is DEADLINE_EXCEEDED, as a call's deadline was.
The client closing its side ends the call once its requests have finished; a stopping worker
(`end_when_idle`) first asks the client to close its side (`closing`) once none runs; the call ending
any other way (cancelled, the connection gone) cancels every request, and the engine aborts them.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Sequence
from contextlib import aclosing

import grpc

from sluice.types import GenerationEvent
from sluice.worker.channel_options import MERGE_MESSAGE_BYTES
from sluice.worker.convert import event_to_pb
from sluice.worker.proto import engine_pb2 as pb
from sluice.worker.status_codes import RequestFailed

log = logging.getLogger("sluice.worker")

# what serves one request: EngineServicer.request_batches
RequestBatches = Callable[[pb.GenerateRequest, Sequence[tuple[str, str]]], AsyncGenerator[list[GenerationEvent], None]]


class StreamSession:
    def __init__(self, request_batches: RequestBatches) -> None:
        self._request_batches = request_batches
        self._outbox: list[pb.RequestOutput] = []
        self._wake = asyncio.Event()
        self._running: dict[int, asyncio.Task[None]] = {}
        self._reading = True
        self._closing = False

    def end_when_idle(self) -> None:
        """The worker stops: once no request runs, ask the client to close its side (`closing`),
        then end the call. An open call would keep the server's stop waiting its whole grace,
        and one the client still held open when the process exits fails at the client with its
        last messages unread."""
        self._closing = True
        self._wake.set()

    async def serve(self, requests: AsyncIterator[pb.StreamRequest]) -> AsyncGenerator[pb.StreamResponse, None]:
        reader = asyncio.create_task(self._read(requests))
        closing_sent = False
        try:
            while True:
                await self._wake.wait()
                self._wake.clear()
                if reader.done() and not reader.cancelled() and reader.exception() is not None:
                    raise reader.exception()  # type: ignore[misc]  # reading broke: end the call
                while self._outbox:
                    yield self._take_message()
                if self._running or self._outbox:
                    continue
                if not self._reading:
                    return  # the client closed its side and no request runs
                if self._closing and not closing_sent:  # ask the client to close its side first
                    closing_sent = True
                    yield pb.StreamResponse(closing=True)
        finally:
            tasks = [reader, *self._running.values()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _read(self, requests: AsyncIterator[pb.StreamRequest]) -> None:
        try:
            async for message in requests:
                for start in message.starts:
                    if start.id in self._running:
                        self._fail(
                            start.id, grpc.StatusCode.INVALID_ARGUMENT, f"stream id {start.id} is already running"
                        )
                        continue
                    self._running[start.id] = asyncio.create_task(self._serve_one(start))
                for request_id in message.cancels:
                    task = self._running.get(request_id)
                    if task is not None:
                        task.cancel()
        finally:
            self._reading = False
            self._wake.set()

    async def _serve_one(self, start: pb.StreamStart) -> None:
        timeout = start.timeout_s if start.HasField("timeout_s") else None
        try:
            async with asyncio.timeout(timeout):
                async with aclosing(
                    self._request_batches(start.request, tuple(start.trace_context.items()))
                ) as batches:
                    async for batch in batches:
                        self._emit(pb.RequestOutput(id=start.id, events=[event_to_pb(e) for e in batch]))
        except RequestFailed as failed:
            self._fail(start.id, failed.code, failed.details, failed.kind)
        except TimeoutError:
            self._fail(start.id, grpc.StatusCode.DEADLINE_EXCEEDED, "deadline exceeded")
        except Exception as exc:  # a defect: this request fails (as a Generate call would, UNKNOWN), the others go on
            log.exception("request failed in the worker")
            self._fail(start.id, grpc.StatusCode.UNKNOWN, f"worker error: {type(exc).__name__}")
        finally:
            self._running.pop(start.id, None)
            self._wake.set()

    def _take_message(self) -> pb.StreamResponse:
        """The outbox's first outputs, up to MERGE_MESSAGE_BYTES (at least one)."""
        size, n = 0, 0
        for output in self._outbox:
            size += output.ByteSize()
            if n and size > MERGE_MESSAGE_BYTES:
                break
            n += 1
        outputs, self._outbox = self._outbox[:n], self._outbox[n:]
        return pb.StreamResponse(outputs=outputs)

    def _fail(self, stream_id: int, code: grpc.StatusCode, details: str, kind: str = "") -> None:
        self._emit(
            pb.RequestOutput(
                id=stream_id, status=pb.RequestStatus(code=code.value[0], details=details, error_kind=kind)
            )
        )

    def _emit(self, output: pb.RequestOutput) -> None:
        self._outbox.append(output)
        self._wake.set()
