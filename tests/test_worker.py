"""The gRPC worker and its client, against a real `sluice worker` process (tiny random llama)."""

from __future__ import annotations

import asyncio
import filecmp
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from sluice.engine.async_engine import AsyncEngine
from sluice.engine.config import EngineConfig
from sluice.engine.engine import LLMEngine
from sluice.errors import ContextWindowExceededError, EngineUnavailableError, InvalidRequestError
from sluice.models.loader import load_model
from sluice.types import GenerationRequest, SamplingParams
from sluice.worker.engine_client import EngineClient, ModelInfo
from sluice.worker.grpc_client import GrpcEngineClient
from sluice.worker.in_process import InProcessEngineClient
from tests.server_process import free_port, start_worker

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def worker(tiny_llama_dir):
    address = f"127.0.0.1:{free_port()}"
    proc = start_worker(address, ["--model", str(tiny_llama_dir), "--kv-cache-gib", "0.05"])
    proc.extra["address"] = address
    yield proc
    assert proc.stop() == 0  # SIGTERM is a clean exit


def _req(rid: str, n: int = 12, max_tokens: int = 20, **kw) -> GenerationRequest:
    prompt = [(7 * i + len(rid)) % 250 + 3 for i in range(n)]
    return GenerationRequest(rid, prompt, SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True, **kw))


async def _collect(client: EngineClient, req: GenerationRequest) -> tuple[list[int], str]:
    tokens, text = [], ""
    async for ev in client.generate(req):
        tokens += ev.token_ids
        text += ev.text
    return tokens, text


def test_grpc_equals_in_process(worker, tiny_llama_dir):
    loaded = load_model(tiny_llama_dir, progress=False)
    engine = AsyncEngine(LLMEngine(loaded, EngineConfig(num_kv_blocks=64))).start()
    local = InProcessEngineClient(engine, ModelInfo("tiny", 256, loaded.tokenizer.vocab_size))

    async def run():
        remote = GrpcEngineClient(worker.extra["address"])
        reqs = [_req(f"r{i}", n=5 + 3 * i) for i in range(6)]
        over_grpc = await asyncio.gather(*(_collect(remote, r) for r in reqs))
        in_proc = await asyncio.gather(*(_collect(local, _req(r.request_id, n=len(r.prompt_token_ids))) for r in reqs))
        info = await remote.info()
        await remote.close()
        return over_grpc, in_proc, info

    try:
        over_grpc, in_proc, info = asyncio.run(run())
    finally:
        engine.shutdown()
    assert over_grpc == in_proc
    assert info.name == tiny_llama_dir.name and info.max_model_len > 0


def test_errors_map_back(worker):
    async def run():
        client = GrpcEngineClient(worker.extra["address"])
        info = await client.info()
        with pytest.raises(ContextWindowExceededError):
            await _collect(client, _req("long", n=info.max_model_len + 5))
        with pytest.raises(InvalidRequestError):
            await _collect(client, GenerationRequest("empty", [], SamplingParams()))
        with pytest.raises(InvalidRequestError):
            await _collect(client, GenerationRequest("bad", [1, 2], SamplingParams(max_tokens=0)))
        await client.close()

    asyncio.run(run())


def test_cancel_and_deadline_free_the_engine(worker):
    async def running(client: GrpcEngineClient) -> int:
        return (await client.stats()).num_running

    async def run():
        client = GrpcEngineClient(worker.extra["address"])
        stream = client.generate(_req("cancel-me", max_tokens=100_000 // 1000))
        seen = 0
        async for _ in stream:
            seen += 1
            if seen == 3:
                break
        await stream.aclose()
        t0 = time.monotonic()
        while await running(client):
            assert time.monotonic() - t0 < 1.0
            await asyncio.sleep(0.02)
        stats = await client.stats()
        assert stats.kv_blocks_used == 0
        with pytest.raises(EngineUnavailableError):  # a deadline that passes aborts the call
            async for _ in client.generate(_req("slow", max_tokens=200), timeout=0.05):
                await asyncio.sleep(0.1)
        t0 = time.monotonic()
        while await running(client):
            assert time.monotonic() - t0 < 1.0
            await asyncio.sleep(0.02)
        await client.close()

    asyncio.run(run())


def test_events_are_batched_for_a_slow_reader(tiny_llama):
    """What the worker sends per gRPC message is one `generate_batches` item: every event
    queued since the last read. A reader slower than the engine gets fewer, larger batches."""
    engine = AsyncEngine(LLMEngine(tiny_llama, EngineConfig(num_kv_blocks=64))).start()

    async def run():
        batches, tokens = 0, []
        async for batch in engine.generate_batches(_req("slow-reader", max_tokens=40)):
            batches += 1
            tokens += [t for ev in batch for t in ev.token_ids]
            await asyncio.sleep(0.05)
        return batches, tokens

    try:
        batches, tokens = asyncio.run(run())
    finally:
        engine.shutdown()
    assert len(tokens) == 40 and batches < 20


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


def test_health_reports_loading_then_ready():
    """The worker listens before its model is loaded; Health says so, then turns ready
    (the bundled model: it takes seconds to load, long enough to observe)."""
    address = f"unix:{Path(tempfile.mkdtemp()) / 'w.sock'}"
    proc = subprocess.Popen(
        [sys.executable, "-m", "sluice.cli", "worker", "--listen", address, "--kv-cache-gib", "0.1"],
        stderr=subprocess.DEVNULL,
    )
    try:
        async def run():
            client = GrpcEngineClient(address)
            states = []
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                try:
                    ready, detail = await client.health(timeout=1)
                except EngineUnavailableError:
                    await asyncio.sleep(0.01)
                    continue
                states.append((ready, detail))
                if ready:
                    break
                await asyncio.sleep(0.2)
            await client.close()
            return states

        states = asyncio.run(run())
        assert states[-1] == (True, "ready")
        assert any(not r and "loading" in d for r, d in states), states
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(15) == 0


def test_committed_stubs_are_current(tmp_path):
    from grpc_tools import protoc

    src = ROOT / "src"
    rc = protoc.main(
        ["protoc", f"-I{src}", f"--python_out={tmp_path}", f"--pyi_out={tmp_path}", f"--grpc_python_out={tmp_path}",
         str(src / "sluice/worker/proto/engine.proto")]
    )
    assert rc == 0
    for name in ("engine_pb2.py", "engine_pb2.pyi", "engine_pb2_grpc.py"):
        fresh = tmp_path / "sluice/worker/proto" / name
        assert filecmp.cmp(fresh, src / "sluice/worker/proto" / name, shallow=False), f"{name} is stale: run `make proto`"
