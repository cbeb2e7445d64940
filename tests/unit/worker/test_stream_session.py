"""A Stream call's two ends on scripted requests: the worker's (worker/stream_session.py), where
many requests' events leave as one message per engine step and each request fails, ends, times
out and is cancelled on its own; and how both ends bound the size of a merged message."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from functools import partial

import grpc

from sluice.types import FinishReason, GenerationEvent, Usage
from sluice.worker.channel_options import MERGE_MESSAGE_BYTES
from sluice.worker.proto import engine_pb2 as pb
from sluice.worker.status_codes import CONTEXT_WINDOW, ERROR_KIND_KEY, RequestFailed
from sluice.worker.stream_mux import StreamMux
from sluice.worker.stream_session import StreamSession


class Engine:
    """Scripted requests: each yields one event per `step()`, as the engine's batch does."""

    def __init__(self, tokens: int = 3) -> None:
        self.tokens = tokens
        self.step_done = asyncio.Condition()
        self.steps = 0
        self.closed: list[str] = []  # requests whose generator was closed (the engine aborts them)

    async def step(self) -> None:
        async with self.step_done:
            self.steps += 1
            self.step_done.notify_all()

    def stepped_past(self, step: int) -> bool:
        return self.steps > step

    async def request_batches(
        self, request: pb.GenerateRequest, trace: Sequence[tuple[str, str]]
    ) -> AsyncGenerator[list[GenerationEvent], None]:
        if request.request_id == "too-long":
            raise RequestFailed(
                grpc.StatusCode.INVALID_ARGUMENT, "prompt is too long", ((ERROR_KIND_KEY, CONTEXT_WINDOW),)
            )
        seen = self.steps
        try:
            for i in range(self.tokens):
                async with self.step_done:
                    await self.step_done.wait_for(partial(self.stepped_past, seen))
                    seen = self.steps
                last = i == self.tokens - 1
                yield [
                    GenerationEvent(
                        request.request_id,
                        f"t{i}",
                        [i],
                        finished=last,
                        finish_reason=FinishReason.LENGTH if last else None,
                        usage=Usage(1, i + 1),
                    )
                ]
        finally:
            self.closed.append(request.request_id)


def _start(stream_id: int, request_id: str, timeout_s: float | None = None) -> pb.StreamStart:
    return pb.StreamStart(id=stream_id, request=pb.GenerateRequest(request_id=request_id), timeout_s=timeout_s)


class Client:
    """The client's side: what it sends, and every response message it got."""

    def __init__(self, engine: Engine) -> None:
        self.sent: asyncio.Queue[pb.StreamRequest | None] = asyncio.Queue()
        self.session = StreamSession(engine.request_batches)
        self.messages: list[pb.StreamResponse] = []
        self.done = asyncio.create_task(self._read())

    async def _requests(self) -> AsyncIterator[pb.StreamRequest]:
        while (message := await self.sent.get()) is not None:
            yield message

    async def _read(self) -> None:
        async for message in self.session.serve(self._requests()):
            self.messages.append(message)

    def send(self, starts: Sequence[pb.StreamStart] = (), cancels: Sequence[int] = ()) -> None:
        self.sent.put_nowait(pb.StreamRequest(starts=starts, cancels=cancels))

    async def settle(self) -> None:
        """Let every task run until none is ready (no clock involved)."""
        for _ in range(20):
            await asyncio.sleep(0)

    def outputs(self, stream_id: int) -> list[pb.RequestOutput]:
        return [o for m in self.messages for o in m.outputs if o.id == stream_id]


async def _run_to_the_end(engine: Engine, starts: list[pb.StreamStart]) -> Client:
    """Start the requests, step the engine until they have all their tokens, close the client's
    side, and wait for the call to end."""
    client = Client(engine)
    client.send(starts)
    await client.settle()
    for _ in range(engine.tokens):
        await engine.step()
        await client.settle()
    client.sent.put_nowait(None)  # the client closes its side: the call ends, its requests done
    await asyncio.wait_for(client.done, 60)
    return client


def test_a_step_of_every_request_leaves_as_one_message():
    messages = asyncio.run(_run_to_the_end(Engine(tokens=3), [_start(1, "a"), _start(2, "b"), _start(3, "c")])).messages
    assert len(messages) == 3  # one per step, not one per request and step
    for step, message in enumerate(messages):
        assert sorted(o.id for o in message.outputs) == [1, 2, 3]
        assert all([e.text for e in o.events] == [f"t{step}"] for o in message.outputs)
    assert all(o.events[-1].finished for o in messages[-1].outputs)


def test_a_request_fails_alone_with_the_status_a_generate_call_would_end_with():
    client = asyncio.run(
        _run_to_the_end(Engine(tokens=2), [_start(1, "fine"), _start(2, "too-long"), _start(1, "same-id")])
    )
    (failed,) = client.outputs(2)
    assert failed.status.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    assert failed.status.error_kind == CONTEXT_WINDOW and "too long" in failed.status.details
    fine = client.outputs(1)
    # the duplicate start of id 1 is refused; the running request 1 is unharmed
    assert any(o.HasField("status") and "already running" in o.status.details for o in fine)
    assert [e.text for o in fine for e in o.events] == ["t0", "t1"]


def test_cancel_and_timeout_end_one_request_and_a_stopping_worker_ends_the_call():
    async def run():
        engine = Engine(tokens=1000)
        client = Client(engine)
        client.send([_start(1, "cancelled"), _start(2, "timed-out", timeout_s=0.01), _start(3, "runs")])
        await client.settle()
        await engine.step()
        await client.settle()
        client.send(cancels=[1, 99])  # 99: unknown, ignored
        for _ in range(6000):  # no step comes: only the deadline ends it (bounded: 60 s)
            if "timed-out" in engine.closed:
                break
            await asyncio.sleep(0.01)
        await client.settle()
        assert "cancelled" in engine.closed and "runs" not in engine.closed
        await engine.step()
        await client.settle()
        client.session.end_when_idle()  # the worker stops: the call ends once nothing runs
        await client.settle()
        assert not client.done.done() and not any(m.closing for m in client.messages)  # "runs" runs
        client.send(cancels=[3])
        await client.settle()
        assert client.messages[-1].closing  # nothing runs: the client is asked to close its side
        assert not client.done.done()  # the call waits for that
        client.sent.put_nowait(None)
        await asyncio.wait_for(client.done, 60)
        return client

    client = asyncio.run(run())
    assert [e.text for o in client.outputs(1) for e in o.events] == ["t0"]
    (timed_out,) = [o for o in client.outputs(2) if o.HasField("status")]
    assert timed_out.status.code == grpc.StatusCode.DEADLINE_EXCEEDED.value[0]
    assert [e.text for o in client.outputs(3) for e in o.events] == ["t0", "t1"]


def test_the_call_ending_early_closes_every_request():
    async def run():
        engine = Engine(tokens=1000)
        client = Client(engine)
        client.send([_start(1, "a"), _start(2, "b")])
        await client.settle()
        await engine.step()
        await client.settle()
        client.done.cancel()  # the connection went: gRPC cancels the handler
        await asyncio.gather(client.done, return_exceptions=True)
        await client.settle()
        return engine.closed

    assert sorted(asyncio.run(run())) == ["a", "b"]


def test_outputs_merge_into_messages_of_bounded_size():
    """Many requests' outputs share a message only up to MERGE_MESSAGE_BYTES: three outputs of
    ~40 % of it each leave as two messages (and one larger than it alone), never one too large."""
    big = "x" * int(0.4 * MERGE_MESSAGE_BYTES)

    async def batches(
        request: pb.GenerateRequest, trace: Sequence[tuple[str, str]]
    ) -> AsyncGenerator[list[GenerationEvent], None]:
        text = big * 3 if request.request_id == "huge" else big
        yield [
            GenerationEvent(
                request.request_id, text, [1], finished=True, finish_reason=FinishReason.LENGTH, usage=Usage(1, 1)
            )
        ]

    async def run(ids: list[str]) -> list[pb.StreamResponse]:
        session = StreamSession(batches)

        async def requests() -> AsyncIterator[pb.StreamRequest]:
            yield pb.StreamRequest(starts=[_start(i + 1, rid) for i, rid in enumerate(ids)])

        return [m async for m in session.serve(requests())]

    three = asyncio.run(run(["a", "b", "c"]))
    assert [len(m.outputs) for m in three] == [2, 1]
    assert all(m.ByteSize() <= MERGE_MESSAGE_BYTES + 1024 for m in three)
    assert [len(m.outputs) for m in asyncio.run(run(["huge", "a"]))] == [1, 1]


def test_the_clients_starts_merge_into_messages_of_bounded_size():
    """What the client sends merges the same way: the queued starts go as few messages, none
    past MERGE_MESSAGE_BYTES unless one start alone is."""

    class Call:  # the gRPC call: only what StreamMux uses; the test reads the request iterator
        def __init__(self, requests: AsyncIterator[pb.StreamRequest]) -> None:
            self.requests = requests

        def __aiter__(self):
            return self

        async def __anext__(self):
            await asyncio.Event().wait()  # no responses

        def cancel(self) -> None:
            pass

    async def run() -> list[pb.StreamRequest]:
        calls: list[Call] = []

        def open_call(requests: AsyncIterator[pb.StreamRequest]) -> Call:
            calls.append(Call(requests))
            return calls[-1]

        mux = StreamMux(open_call)
        tokens = int(0.4 * MERGE_MESSAGE_BYTES / 3)  # ids of 3 bytes each
        for rid in "abc":
            mux.start(pb.GenerateRequest(request_id=rid, prompt_token_ids=[100_000] * tokens))
        mux.start(pb.GenerateRequest(request_id="small", prompt_token_ids=[1]))
        sent = [await anext(calls[0].requests), await anext(calls[0].requests)]
        await mux.close()
        return sent

    sent = asyncio.run(run())
    assert [[s.request.request_id for s in m.starts] for m in sent] == [["a", "b"], ["c", "small"]]
    assert all(m.ByteSize() <= MERGE_MESSAGE_BYTES for m in sent)
