"""The worker's standard gRPC health service (what Kubernetes' grpc probes call) and its drain
(SIGUSR1, the preStop hook): health turns NOT_SERVING, new requests are refused with
UNAVAILABLE, running streams finish in full, then the process exits 0 by itself."""

from __future__ import annotations

import asyncio
import signal

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from sluice.types import FinishReason, GenerationRequest, SamplingParams
from sluice.worker.convert import request_to_pb
from sluice.worker.grpc_client import GrpcEngineClient
from sluice.worker.proto import engine_pb2_grpc as pb_grpc
from sluice.worker.standard_health import LIVENESS, WorkerHealth
from tests.server_process import free_port, start_worker

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


async def _check(channel: grpc.aio.Channel, service: str) -> int:
    stub = health_pb2_grpc.HealthStub(channel)
    return (await stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)).status


def test_standard_health_states_follow_the_worker():
    async def run():
        server = grpc.aio.server()
        health = WorkerHealth()
        health.add_to(server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
                await health.loading()
                assert (await _check(ch, ""), await _check(ch, LIVENESS)) == (NOT_SERVING, SERVING)
                await health.ready()
                assert (await _check(ch, ""), await _check(ch, LIVENESS)) == (SERVING, SERVING)
                await health.draining()  # out of the Service, but never restarted mid-drain
                assert (await _check(ch, ""), await _check(ch, LIVENESS)) == (NOT_SERVING, SERVING)
                await health.stopped()
                assert (await _check(ch, ""), await _check(ch, LIVENESS)) == (NOT_SERVING, NOT_SERVING)
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await _check(ch, "no-such-service")
                assert err.value.code() is grpc.StatusCode.NOT_FOUND
        finally:
            await server.stop(0)

    asyncio.run(run())


def _long(rid: str, max_tokens: int) -> GenerationRequest:
    prompt = [(5 * i + len(rid)) % 250 + 3 for i in range(12)]
    return GenerationRequest(rid, prompt, SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True))


async def _collect(
    client: GrpcEngineClient, req: GenerationRequest, first: asyncio.Event
) -> tuple[int, FinishReason | None]:
    tokens, reason = 0, None
    async for ev in client.generate(req):
        first.set()
        tokens += len(ev.token_ids)
        if ev.finished:
            reason = ev.finish_reason
    return tokens, reason


def test_sigusr1_drains_running_streams_then_exits(tiny_llama_dir):
    address = f"127.0.0.1:{free_port()}"
    # one sequence at a time: three streams run back to back, so the drain has work to wait for.
    # 40 ms per engine step (the step_delay_s fault): the last two streams provably outlast the
    # drain's checks below (>= 2 x 120 steps = 9.6 s after the first token), however fast the
    # machine — the tiny model alone decoded all three before the checks ended on a quiet one.
    proc = start_worker(
        address,
        [
            "--model",
            str(tiny_llama_dir),
            "--kv-cache-gib",
            "0.05",
            "--max-num-seqs",
            "1",
            "--fault-injection",
            "step_delay_s=0.04",
        ],
    )
    max_tokens = 120

    async def run():
        client = GrpcEngineClient(address)
        async with grpc.aio.insecure_channel(address) as ch:
            assert await _check(ch, "") == SERVING and await _check(ch, LIVENESS) == SERVING
            first = asyncio.Event()
            streams = [asyncio.create_task(_collect(client, _long(f"d{i}", max_tokens), first)) for i in range(3)]
            await asyncio.wait_for(first.wait(), 60)
            proc.process.send_signal(signal.SIGUSR1)
            for _ in range(200):  # health turns at once; the loop only bounds the wait
                if await _check(ch, "") == NOT_SERVING:
                    break
                await asyncio.sleep(0.05)
            assert await _check(ch, "") == NOT_SERVING
            assert await _check(ch, LIVENESS) == SERVING  # still alive: liveness must not kill a drain
            with pytest.raises(grpc.aio.AioRpcError) as err:  # a new request goes elsewhere
                async for _ in pb_grpc.EngineStub(ch).Generate(request_to_pb(_long("late", 4)), timeout=10):
                    pass
            assert err.value.code() is grpc.StatusCode.UNAVAILABLE and "draining" in err.value.details()
            assert not any(s.done() for s in streams[1:]), "the drain began after the streams were done"
            results = await asyncio.wait_for(asyncio.gather(*streams), 120)
        await client.close()
        return results

    try:
        results = asyncio.run(run())
        assert results == [(max_tokens, FinishReason.LENGTH)] * 3  # every stream finished in full
        assert proc.process.wait(timeout=60) == 0  # exited by itself, no SIGTERM
        assert "drained; exiting" in proc.log()
    finally:
        proc.stop()
