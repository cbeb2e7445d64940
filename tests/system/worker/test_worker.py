"""The gRPC worker and its client, against real `sluice worker` processes (tiny random llama and
the bundled model). Every process is started here and stopped here, by its own PID."""

from __future__ import annotations

import asyncio
import filecmp
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import grpc
import pytest

from sluice.engine.async_engine import AsyncEngine
from sluice.engine.config import EngineConfig
from sluice.engine.engine import LLMEngine
from sluice.errors import ContextWindowExceededError, EngineUnavailableError, InvalidRequestError
from sluice.models.loader import load_model
from sluice.types import FinishReason, GenerationEvent, GenerationRequest, SamplingParams
from sluice.worker.channel_options import CLIENT_OPTIONS
from sluice.worker.convert import request_to_pb
from sluice.worker.engine_client import EngineClient, ModelInfo
from sluice.worker.grpc_client import GrpcEngineClient
from sluice.worker.in_process import InProcessEngineClient
from sluice.worker.proto import engine_pb2_grpc as pb_grpc
from sluice.worker.spawn import LocalWorker, spawn_local_worker
from sluice.worker.worker_main import BUNDLED_NAME
from tests.paths import ROOT
from tests.server_process import free_port, start_worker

TINY_ARGS = ["--kv-cache-gib", "0.05"]


@pytest.fixture(scope="module")
def worker(tiny_llama_dir):
    address = f"127.0.0.1:{free_port()}"
    proc = start_worker(address, ["--model", str(tiny_llama_dir), *TINY_ARGS])
    proc.extra["address"] = address
    yield proc
    assert proc.stop() == 0  # SIGTERM is a clean exit


def _req(rid: str, n: int = 12, max_tokens: int = 20, **kw) -> GenerationRequest:
    prompt = [(7 * i + len(rid)) % 250 + 3 for i in range(n)]
    return GenerationRequest(rid, prompt, SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True, **kw))


async def _collect(
    client: EngineClient, req: GenerationRequest, seen: list[GenerationEvent] | None = None
) -> tuple[list[int], str]:
    tokens, text = [], ""
    async for ev in client.generate(req):
        if seen is not None:
            seen.append(ev)
        tokens += ev.token_ids
        text += ev.text
    return tokens, text


async def _wait_idle(client: GrpcEngineClient, within_s: float = 1.0) -> None:
    t0 = time.monotonic()
    while (await client.stats()).num_running:
        assert time.monotonic() - t0 < within_s, "the request still runs"
        await asyncio.sleep(0.02)


@pytest.mark.parametrize("multiplex", [True, False], ids=["stream-call", "generate-calls"])
def test_grpc_equals_in_process(worker, tiny_llama_dir, multiplex):
    """Six concurrent streams over gRPC give exactly what the engine gives in-process, over one
    Stream call or a Generate call each."""
    loaded = load_model(tiny_llama_dir, progress=False)
    engine = AsyncEngine(LLMEngine(loaded, EngineConfig(num_kv_blocks=64))).start()
    local = InProcessEngineClient(engine, ModelInfo("tiny", 256, loaded.tokenizer.vocab_size))

    async def run():
        remote = GrpcEngineClient(worker.extra["address"], multiplex=multiplex)
        reqs = [_req(f"r{i}", n=5 + 3 * i) for i in range(6)]
        over_grpc = await asyncio.gather(*(_collect(remote, r) for r in reqs))
        in_proc = await asyncio.gather(*(_collect(local, _req(r.request_id, n=len(r.prompt_token_ids))) for r in reqs))
        info = await remote.info()
        await remote.close()
        await local.close()
        return over_grpc, in_proc, info

    over_grpc, in_proc, info = asyncio.run(run())
    assert over_grpc == in_proc
    assert all(len(tokens) == 20 for tokens, _ in over_grpc)
    assert info.name == tiny_llama_dir.name and info.max_model_len == 512


def test_messages_batch_tokens_for_a_slow_reader(worker):
    """Each Generate message carries every event queued since the last one. A reader that stops
    reading (until the engine has finished the request: whatever the machine's speed, it is then
    slower than the engine) makes the transport push back — a small receive window here — and
    the worker then sends the rest in few, large messages."""
    options = [*CLIENT_OPTIONS, ("grpc.http2.lookahead_bytes", 1024), ("grpc.http2.bdp_probe", 0)]

    async def run():
        probe = GrpcEngineClient(worker.extra["address"])
        async with grpc.aio.insecure_channel(worker.extra["address"], options=options) as channel:
            messages, tokens = 0, 0
            async for msg in pb_grpc.EngineStub(channel).Generate(request_to_pb(_req("slow-reader", max_tokens=150))):
                messages += 1
                tokens += sum(len(ev.token_ids) for ev in msg.events)
                if messages == 1:  # pause until the engine is done with the request
                    # the engine runs in the worker's process: nothing to await but its stats
                    while (await probe.stats()).num_running:  # noqa: ASYNC110
                        await asyncio.sleep(0.05)
        await probe.close()
        return messages, tokens

    messages, tokens = asyncio.run(run())
    assert tokens == 150 and messages < 0.75 * tokens, (messages, tokens)


def test_events_are_batched_for_a_slow_reader(tiny_llama):
    """What the worker sends per message is one `generate_batches` item: every event queued
    since the last read."""
    engine = AsyncEngine(LLMEngine(tiny_llama, EngineConfig(num_kv_blocks=64))).start()

    async def run():
        batches, tokens = 0, []
        async for batch in engine.generate_batches(_req("slow-reader", max_tokens=40)):
            batches += 1
            tokens += [t for ev in batch for t in ev.token_ids]
            # slower than the engine, whatever its speed; the engine's thread signals no event for it
            while batches == 1 and engine.stats().num_running:  # noqa: ASYNC110
                await asyncio.sleep(0.02)
        return batches, tokens

    try:
        batches, tokens = asyncio.run(run())
    finally:
        engine.shutdown()
    assert len(tokens) == 40 and batches <= 3  # the first, then (nearly) everything at once


@pytest.mark.parametrize("multiplex", [True, False], ids=["stream-call", "generate-calls"])
def test_errors_map_back_before_any_event(worker, multiplex):
    async def run():
        client = GrpcEngineClient(worker.extra["address"], multiplex=multiplex)
        info = await client.info()
        seen: list[GenerationEvent] = []
        with pytest.raises(ContextWindowExceededError, match="too long"):
            await _collect(client, _req("long", n=info.max_model_len + 5), seen)
        with pytest.raises(ContextWindowExceededError):  # a 32k-token prompt fits in one message
            await _collect(client, _req("32k", n=32_768), seen)
        with pytest.raises(InvalidRequestError, match="empty"):
            await _collect(client, GenerationRequest("empty", [], SamplingParams()), seen)
        with pytest.raises(InvalidRequestError, match="max_tokens"):
            await _collect(client, GenerationRequest("bad", [1, 2], SamplingParams(max_tokens=0)), seen)
        with pytest.raises(InvalidRequestError, match="vocabulary"):
            await _collect(client, GenerationRequest("oov", [1, 10**6], SamplingParams()), seen)
        with pytest.raises(InvalidRequestError):  # does not fit the wire's int32: refused client-side
            await _collect(client, GenerationRequest("huge", [1, 2], SamplingParams(max_tokens=2**40)), seen)
        assert seen == []
        assert (await client.stats()).num_running == 0
        await client.close()

    asyncio.run(run())


@pytest.mark.parametrize("multiplex", [True, False], ids=["stream-call", "generate-calls"])
def test_cancel_and_deadline_abort_and_free_the_engine(worker, multiplex):
    async def run():
        client = GrpcEngineClient(worker.extra["address"], multiplex=multiplex)
        before = await client.stats()
        stream = client.generate(_req("cancel-me", max_tokens=480))
        seen = 0
        async for _ in stream:
            seen += 1
            if seen == 3:
                break
        await stream.aclose()  # what an HTTP disconnect does
        await _wait_idle(client)
        after = await client.stats()
        assert after.kv_blocks_used == 0
        assert after.output_tokens - before.output_tokens < 480  # aborted, not run to the end

        with pytest.raises(EngineUnavailableError, match="deadline"):
            async for _ in client.generate(_req("slow", max_tokens=480), timeout_s=0.1):
                await asyncio.sleep(0.05)
        await _wait_idle(client)
        final = await client.stats()
        assert final.kv_blocks_used == 0 and final.output_tokens - after.output_tokens < 480
        await client.close()

    asyncio.run(run())


def test_unreachable_worker_is_unavailable_not_a_hang():
    async def run():
        client = GrpcEngineClient(f"127.0.0.1:{free_port()}")
        t0 = time.monotonic()
        assert not await client.ready()
        with pytest.raises(EngineUnavailableError):
            await _collect(client, _req("x"))
        await client.close()
        return time.monotonic() - t0

    assert asyncio.run(run()) < 15


async def _spawn_tiny(model_dir: Path) -> LocalWorker:
    return await spawn_local_worker(str(model_dir), engine_args=TINY_ARGS, timeout_s=120)


def test_worker_killed_mid_stream_raises_unavailable(tiny_llama_dir):
    async def run():
        worker = await _spawn_tiny(tiny_llama_dir)
        client = GrpcEngineClient(worker.address)
        try:
            seen, t_kill = 0, 0.0
            with pytest.raises(EngineUnavailableError):
                async for _ in client.generate(_req("doomed", max_tokens=480)):
                    seen += 1
                    if seen == 3:
                        os.kill(worker.pid, signal.SIGKILL)  # the PID we started
                        t_kill = time.monotonic()
            # the stream ends with the error soon after the kill, not at some far timeout (a bound
            # no busy machine reaches: the gRPC deadline of a request is minutes)
            assert time.monotonic() - t_kill < 60
            assert not await client.ready()
            with pytest.raises(EngineUnavailableError):
                await _collect(client, _req("after"))
        finally:
            await client.close()
            worker.stop(grace_s=2)

    asyncio.run(run())


def test_sigterm_mid_stream_ends_it_and_exits_0(tiny_llama_dir):
    # 20 ms per step: the 480-token stream lasts ≥ 9.6 s however fast the machine, so the
    # SIGTERM after its third event provably lands mid-stream
    async def run():
        worker = await spawn_local_worker(
            str(tiny_llama_dir), engine_args=[*TINY_ARGS, "--fault-injection", "step_delay_s=0.02"], timeout_s=120
        )
        client = GrpcEngineClient(worker.address)
        try:
            events: list[GenerationEvent] = []
            stopping = None
            async for ev in client.generate(_req("in-flight", max_tokens=480)):
                events.append(ev)
                if len(events) == 3:  # SIGTERM; SIGKILL only past a generous grace
                    stopping = asyncio.ensure_future(asyncio.to_thread(worker.stop, 60.0))
            code = await stopping
            return events, code
        finally:
            await client.close()
            worker.stop(grace_s=2)

    events, code = asyncio.run(run())
    assert code == 0  # exited by itself: 0, not the SIGKILL's -9
    # aborted, not run out: ABORT with fewer than the 480 tokens (no elapsed-time bound: the
    # stop's grace is what a busy machine stretches)
    assert events[-1].finished and events[-1].finish_reason == FinishReason.ABORT
    assert sum(len(e.token_ids) for e in events) < 480


def test_spawn_failure_quotes_the_worker_stderr(tmp_path):
    with pytest.raises(EngineUnavailableError, match="exited with code 2") as err:
        asyncio.run(spawn_local_worker(str(tmp_path / "no-such-model"), timeout_s=60))
    assert "does not exist" in str(err.value)


def test_bundled_worker_reports_loading_then_ready_and_matches_the_engine(bundled) -> None:
    """The worker listens before its model is loaded (Health says so), then turns ready, and
    its greedy output equals LLMEngine's for the same request, token for token."""
    prompt = bundled.tokenizer.encode_chat([{"role": "user", "content": "Name three colors."}])
    sampling = SamplingParams(max_tokens=12, temperature=0)
    engine = LLMEngine(bundled, EngineConfig(num_kv_blocks=64))
    engine.add_request(GenerationRequest("ref", prompt, sampling))
    expected: list[int] = []
    while engine.has_unfinished():
        expected += [t for ev in engine.step() for t in ev.token_ids]

    address = f"unix:{Path(tempfile.mkdtemp()) / 'w.sock'}"
    log = Path(tempfile.mkdtemp()) / "worker.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            # load_delay_s: "loading" lasts at least 2 s, so it is seen however fast the load is
            [
                sys.executable,
                "-m",
                "sluice.cli",
                "worker",
                "--listen",
                address,
                "--kv-cache-gib",
                "0.1",
                "--fault-injection",
                "load_delay_s=2",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )

    refused: list[str] = []

    async def run():
        client = GrpcEngineClient(address)
        states = []
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            try:
                ready, detail = await client.health(timeout_s=1)
            except EngineUnavailableError:  # not listening yet: retry on a fresh channel, since
                # a channel's reconnect backoff (up to 1 s) could outlast the ~0.5 s the load takes
                await client.close()
                client = GrpcEngineClient(address)
                await asyncio.sleep(0.01)
                continue
            if not ready:  # refused while loading — unless the load ended since the health answer
                try:
                    await _collect(client, GenerationRequest(f"early-{len(states)}", prompt, sampling))
                except EngineUnavailableError as exc:
                    assert "not ready" in str(exc)
                    refused.append(detail)
                else:
                    assert (await client.health(timeout_s=10))[0], "served while the worker says it is loading"
            states.append((ready, detail))
            if ready:
                break
            await asyncio.sleep(0.2)
        info = await client.info()
        tokens, _ = await _collect(client, GenerationRequest("grpc", prompt, sampling))
        await client.close()
        return states, info, tokens

    try:
        states, info, tokens = asyncio.run(run())
        assert states[-1] == (True, "ready"), log.read_text()
        assert any(not r and "loading" in d for r, d in states), states
        assert refused, "no request was refused while loading (each one raced the load's end)"
        assert info.name == BUNDLED_NAME
        assert tokens == expected
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        assert proc.wait(15) == 0
    assert f"sluice worker listening on {address} (model {BUNDLED_NAME})" in log.read_text()


def test_committed_stubs_are_current(tmp_path):
    from grpc_tools import protoc

    src = ROOT / "src"
    rc = protoc.main(
        [
            "protoc",
            f"-I{src}",
            f"--python_out={tmp_path}",
            f"--pyi_out={tmp_path}",
            f"--grpc_python_out={tmp_path}",
            str(src / "sluice/worker/proto/engine.proto"),
        ]
    )
    assert rc == 0
    for name in ("engine_pb2.py", "engine_pb2.pyi", "engine_pb2_grpc.py"):
        fresh = tmp_path / "sluice/worker/proto" / name
        assert filecmp.cmp(fresh, src / "sluice/worker/proto" / name, shallow=False), (
            f"{name} is stale: run `make proto`"
        )
