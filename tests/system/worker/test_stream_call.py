"""The Stream call (many requests over one gRPC call) against real workers: an engine step of
every request arrives as one message, a stopping worker ends the call cleanly, a worker without
Stream is served by Generate, and a worker given up fails every request on the call. Every
process is started here and stopped here, by its own PID."""

from __future__ import annotations

import asyncio

import grpc

from sluice.engine.async_engine import AsyncEngine
from sluice.engine.config import EngineConfig
from sluice.engine.engine import LLMEngine
from sluice.errors import EngineUnavailableError
from sluice.types import FinishReason, GenerationRequest, SamplingParams
from sluice.worker.convert import request_to_pb
from sluice.worker.engine_client import ModelInfo
from sluice.worker.grpc_client import GrpcEngineClient
from sluice.worker.grpc_server import EngineServicer
from sluice.worker.proto import engine_pb2 as pb
from sluice.worker.proto import engine_pb2_grpc as pb_grpc
from sluice.worker.spawn import spawn_local_worker
from tests.server_process import free_port, start_worker

TINY_ARGS = ["--kv-cache-gib", "0.05"]


def _req(rid: str, max_tokens: int = 16) -> GenerationRequest:
    prompt = [(3 * i + len(rid)) % 250 + 3 for i in range(10)]
    return GenerationRequest(rid, prompt, SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True))


async def _collect(client: GrpcEngineClient, req: GenerationRequest) -> list[int]:
    return [t async for ev in client.generate(req) for t in ev.token_ids]


def test_a_step_of_every_request_arrives_as_one_message(tiny_llama_dir):
    """Four requests started together decode together: their events share messages (one per
    step), where Generate calls took one message per request and step."""
    address = f"127.0.0.1:{free_port()}"
    proc = start_worker(address, ["--model", str(tiny_llama_dir), *TINY_ARGS])

    async def run():
        outgoing: asyncio.Queue[pb.StreamRequest | None] = asyncio.Queue()

        async def requests():
            while (message := await outgoing.get()) is not None:
                yield message

        starts = [pb.StreamStart(id=i, request=request_to_pb(_req(f"r{i}", max_tokens=24))) for i in range(1, 5)]
        outgoing.put_nowait(pb.StreamRequest(starts=starts))
        outgoing.put_nowait(None)  # nothing more to send: the call ends when the four have
        async with grpc.aio.insecure_channel(address) as channel:
            return [m async for m in pb_grpc.EngineStub(channel).Stream(requests())]

    try:
        messages = asyncio.run(run())
    finally:
        assert proc.stop() == 0
    tokens = {
        i: sum(len(e.token_ids) for m in messages for o in m.outputs if o.id == i for e in o.events)
        for i in range(1, 5)
    }
    assert tokens == {1: 24, 2: 24, 3: 24, 4: 24}
    assert max(len({o.id for o in m.outputs}) for m in messages) == 4
    assert len(messages) < sum(len(m.outputs) for m in messages)  # fewer messages than per-request outputs


def test_sigterm_ends_an_open_stream_call_once_its_requests_are_aborted(tiny_llama_dir):
    """The client keeps its side of the call open (as the gateway does); a SIGTERM aborts the
    running request, which gets its final ABORT event; the worker then asks the client to close
    its side (`closing`) and ends the call with OK, not by cancelling it when the stop's grace
    runs out, nor by exiting while the client still holds it open (its last messages unread)."""

    async def run():
        # 20 ms per step: the 480-token request provably runs when the SIGTERM lands
        worker = await spawn_local_worker(
            str(tiny_llama_dir), engine_args=[*TINY_ARGS, "--fault-injection", "step_delay_s=0.02"], timeout_s=120
        )
        outgoing: asyncio.Queue[pb.StreamRequest | None] = asyncio.Queue()

        async def requests():
            while (message := await outgoing.get()) is not None:
                yield message

        outgoing.put_nowait(pb.StreamRequest(starts=[pb.StreamStart(id=1, request=request_to_pb(_req("long", 480)))]))
        events, stopping = [], None
        try:
            async with grpc.aio.insecure_channel(worker.address) as channel:
                call = pb_grpc.EngineStub(channel).Stream(requests())
                closing_after = None
                async for message in call:
                    events += [e for o in message.outputs for e in o.events]
                    if len(events) >= 3 and stopping is None:
                        stopping = asyncio.ensure_future(asyncio.to_thread(worker.stop, 60.0))
                    if message.closing:
                        closing_after = len(events)
                        outgoing.put_nowait(None)  # what the client does: close its side
                return events, closing_after, await call.code(), await stopping
        finally:
            worker.stop(grace_s=2)

    events, closing_after, code, exit_code = asyncio.run(run())
    assert events[-1].finished and events[-1].finish_reason == FinishReason.ABORT.value
    assert closing_after == len(events)  # asked only once the request had ended
    assert code == grpc.StatusCode.OK and exit_code == 0


class _WorkerWithoutStream(EngineServicer):
    """A worker from before the Stream method: what gRPC answers for a method it does not have."""

    async def Stream(self, request_iterator, context):
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, "Method not implemented!")
        yield pb.StreamResponse()  # unreachable: abort() raises


def test_a_worker_without_stream_is_served_by_generate_calls(tiny_llama):
    engine = AsyncEngine(LLMEngine(tiny_llama, EngineConfig(num_kv_blocks=64))).start()

    async def run():
        servicers = {}
        for name, cls in (("old", _WorkerWithoutStream), ("new", EngineServicer)):
            servicer = cls()
            servicer.set_engine(engine, ModelInfo("tiny", 256, tiny_llama.tokenizer.vocab_size))
            server = grpc.aio.server()
            pb_grpc.add_EngineServicer_to_server(servicer, server)
            port = server.add_insecure_port("127.0.0.1:0")
            await server.start()
            servicers[name] = (server, GrpcEngineClient(f"127.0.0.1:{port}"))
        try:
            old, new = servicers["old"][1], servicers["new"][1]
            first = await asyncio.gather(*(_collect(old, _req(f"o{i}")) for i in range(3)))
            later = await _collect(old, _req("o9"))
            expected = await asyncio.gather(*(_collect(new, _req(f"o{i}")) for i in range(3)))
            return first, later, expected, old.multiplex, new.multiplex
        finally:
            for server, client in servicers.values():
                await client.close()
                await server.stop(0)

    try:
        first, later, expected, old_multiplex, new_multiplex = asyncio.run(run())
    finally:
        engine.shutdown()
    assert first == expected and all(len(t) == 16 for t in first) and len(later) == 16
    assert not old_multiplex and new_multiplex


def test_a_worker_given_up_fails_every_request_on_the_call(tiny_llama_dir):
    """`abandon_calls` (the health poller found the worker hung) fails every request on the
    shared call at once, and the next request opens a new call."""
    address = f"127.0.0.1:{free_port()}"
    proc = start_worker(address, ["--model", str(tiny_llama_dir), *TINY_ARGS, "--fault-injection", "step_delay_s=0.02"])

    async def run():
        client = GrpcEngineClient(address)
        started = asyncio.Event()

        async def one(rid: str) -> None:
            async for _ in client.generate(_req(rid, 480)):
                started.set()

        tasks = [asyncio.create_task(one(f"long{i}")) for i in range(3)]
        await started.wait()
        abandoned = client.abandon_calls("missed 3 health checks")
        results = await asyncio.gather(*tasks, return_exceptions=True)
        after = await _collect(client, _req("after", 4))
        await client.close()
        return abandoned, results, after

    try:
        abandoned, results, after = asyncio.run(run())
    finally:
        assert proc.stop() == 0
    assert abandoned == 3
    assert all(isinstance(r, EngineUnavailableError) and "given up: missed 3 health checks" in str(r) for r in results)
    assert len(after) == 4
