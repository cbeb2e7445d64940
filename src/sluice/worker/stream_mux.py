"""`StreamMux`: a client's requests to one worker, over one Stream call (the client's side).

The call is opened on the first request and again on the first request after it ended. Each
request gets a queue; one reader task takes the call's messages and puts each request's events
in its queue, so an engine step costs the gateway one gRPC message, not one per request.
Starts and cancels go out through one sender (a call takes one write at a time), merged into one
message when several are waiting.

A stopping worker asks for the call's end (`closing`) once none of its requests runs: the
client closes its side, so the call ends cleanly before the worker exits, and the next request
opens a new call.

A worker without the Stream method (older than it) fails the call with UNIMPLEMENTED: every
request on it gets StreamUnsupportedError, and the client sends them by Generate instead.

A request's own failure arrives as its status and fails that request alone. The call failing —
the worker gone, the connection broken, `abandon()` — fails every request still on it with the
error a Generate call would have raised; nothing waits forever.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import grpc

from sluice.errors import EngineUnavailableError, SluiceError
from sluice.worker.channel_options import MERGE_MESSAGE_BYTES
from sluice.worker.proto import engine_pb2 as pb
from sluice.worker.status_codes import error_for, error_from


class StreamUnsupportedError(EngineUnavailableError):
    """The worker has no Stream method (a worker older than it): use a Generate call per request."""


# a request's queue holds lists of wire events, then (if it fails) the error to raise
Item = Sequence[pb.Event] | SluiceError


class _Call:
    """One Stream call and the requests on it."""

    def __init__(self, open_call: Callable[[AsyncIterator[pb.StreamRequest]], Any]) -> None:
        self.outgoing: asyncio.Queue[pb.StreamRequest | None] = asyncio.Queue()  # None: close our side
        self.routes: dict[int, asyncio.Queue[Item]] = {}
        self.abandoned: str | None = None
        self.ended = False
        self.closing = False  # the worker asked us to close our side: no new requests here
        self.call = open_call(self._requests())
        self.reader = asyncio.create_task(self._read())

    async def _requests(self) -> AsyncIterator[pb.StreamRequest]:
        held: list[pb.StreamRequest | None] = []  # taken from the queue, not merged: goes next
        while True:
            message = held.pop() if held else await self.outgoing.get()
            if message is None:
                return  # gRPC closes our side of the call
            size = message.ByteSize()
            while not self.outgoing.empty():  # merge what queued meanwhile into one write
                more = self.outgoing.get_nowait()
                more_size = more.ByteSize() if more is not None else 0
                if more is None or size + more_size > MERGE_MESSAGE_BYTES:
                    held.append(more)
                    break
                size += more_size
                message.starts.extend(more.starts)
                message.cancels.extend(more.cancels)
            yield message

    async def _read(self) -> None:
        error: SluiceError = EngineUnavailableError("the worker ended the stream")
        try:
            async for message in self.call:
                if message.closing and not self.closing:  # the worker stops
                    self.closing = True
                    self.outgoing.put_nowait(None)
                for output in message.outputs:
                    queue = self.routes.get(output.id)
                    if queue is None:  # cancelled here meanwhile
                        continue
                    if output.HasField("status"):
                        del self.routes[output.id]
                        s = output.status
                        queue.put_nowait(error_for(s.code, s.details, s.error_kind))
                    else:
                        queue.put_nowait(output.events)
                        if output.events and output.events[-1].finished:
                            del self.routes[output.id]
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.UNIMPLEMENTED:
                error = StreamUnsupportedError(f"the worker has no Stream method ({exc.details()})")
            else:
                error = error_from(exc)
        except asyncio.CancelledError:
            if self.abandoned is None:
                raise  # close(): nobody is waiting for a reason
            error = EngineUnavailableError(f"the worker was given up: {self.abandoned}")
        finally:
            self.ended = True
            for queue in self.routes.values():
                queue.put_nowait(error)
            self.routes.clear()


class StreamMux:
    """`open_call(request_iterator)`: starts a Stream call (the stub's method, with its options)."""

    def __init__(self, open_call: Callable[[AsyncIterator[pb.StreamRequest]], Any]) -> None:
        self._open_call = open_call
        self._current: _Call | None = None
        self._ids = itertools.count(1)

    def start(
        self, request: pb.GenerateRequest, trace_metadata: Sequence[tuple[str, str]] = (), timeout: float | None = None
    ) -> tuple[int, asyncio.Queue[Item]]:
        """Send `request`; returns its stream id and the queue its events and error arrive in."""
        current = self._current
        if current is None or current.ended or current.closing:
            current = self._current = _Call(self._open_call)
        stream_id = next(self._ids)
        queue: asyncio.Queue[Item] = asyncio.Queue()
        current.routes[stream_id] = queue
        start = pb.StreamStart(id=stream_id, request=request, trace_context=dict(trace_metadata), timeout_s=timeout)
        current.outgoing.put_nowait(pb.StreamRequest(starts=[start]))
        return stream_id, queue

    def cancel(self, stream_id: int) -> None:
        """Abort a started request (the worker frees its KV blocks); unknown ids are ignored."""
        current = self._current
        if (
            current is not None
            and current.routes.pop(stream_id, None) is not None
            and not (current.ended or current.closing)
        ):
            current.outgoing.put_nowait(pb.StreamRequest(cancels=[stream_id]))

    def abandon(self, why: str) -> int:
        """Fail every request on the call with EngineUnavailableError and end it; returns how many."""
        current, self._current = self._current, None
        if current is None or current.ended:
            return 0
        count = len(current.routes)
        current.abandoned = why
        current.call.cancel()
        current.reader.cancel()
        return count

    async def close(self) -> None:
        current, self._current = self._current, None
        if current is not None:
            current.call.cancel()
            current.reader.cancel()
            await asyncio.gather(current.reader, return_exceptions=True)
