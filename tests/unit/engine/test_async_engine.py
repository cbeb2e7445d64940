"""The async front: concurrent streams, and abort on leaving a stream early."""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

import pytest

from sluice.engine.async_engine import AsyncEngine
from sluice.engine.config import EngineConfig
from sluice.engine.engine import LLMEngine
from sluice.types import FinishReason, GenerationRequest, SamplingParams


def _engine(tiny_llama) -> AsyncEngine:
    return AsyncEngine(LLMEngine(tiny_llama, EngineConfig(block_size=4, num_kv_blocks=256))).start()


def test_concurrent_streams_match_the_sync_engine(tiny_llama):
    prompts = [[5 + i, 9, 33, 40 + i, 7] * (i + 1) for i in range(6)]
    params = SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True)
    sync = LLMEngine(tiny_llama, EngineConfig(block_size=4, num_kv_blocks=256)).generate(
        [GenerationRequest(f"r{i}", p, params) for i, p in enumerate(prompts)]
    )
    engine = _engine(tiny_llama)

    async def collect(i: int, prompt: list[int]) -> list[int]:
        tokens: list[int] = []
        async for ev in engine.generate(GenerationRequest(f"r{i}", prompt, params)):
            tokens += ev.token_ids
            if ev.finished:
                assert ev.finish_reason is FinishReason.LENGTH
                assert ev.usage.output_tokens == 20
        return tokens

    async def main():
        return await asyncio.gather(*(collect(i, p) for i, p in enumerate(prompts)))

    try:
        streamed = asyncio.run(main())
    finally:
        engine.shutdown()
    assert streamed == [sync[f"r{i}"].token_ids for i in range(len(prompts))]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="thread names through /proc are Linux's")
def test_the_engine_thread_carries_its_name_for_the_system(tiny_llama):
    # top -H, py-spy and bench/serving/served_steps.py see "sluice-engine", not "python"
    engine = _engine(tiny_llama)
    try:
        comm = Path(f"/proc/self/task/{engine._thread.native_id}/comm")
        deadline = time.monotonic() + 120  # generous: the thread names itself as it starts
        while comm.read_text().strip() != "sluice-engine" and time.monotonic() < deadline:
            time.sleep(0.01)
        assert comm.read_text().strip() == "sluice-engine"
    finally:
        engine.shutdown()


def test_leaving_a_stream_aborts_and_frees_blocks_within_a_step(tiny_llama):
    engine = _engine(tiny_llama)
    free_at_start = engine.engine.kv.num_free_blocks
    params = SamplingParams(max_tokens=400, temperature=0.0, ignore_eos=True)

    async def main():
        seen = 0
        async for _ in engine.generate(GenerationRequest("long", list(range(3, 60)), params)):
            seen += 1
            if seen == 3:
                break  # the client goes away
        deadline = time.monotonic() + 120  # generous: a busy machine; the token count proves the abort
        while time.monotonic() < deadline:
            s = engine.stats()
            if s.num_running == 0 and s.num_waiting == 0:
                assert s.output_tokens < 200, f"{s.output_tokens} of 400 tokens generated: not aborted"
                return s
            await asyncio.sleep(0.01)
        raise AssertionError("request still running long after the stream was left")

    try:
        stats = asyncio.run(main())
        assert engine.engine.kv.num_free_blocks == free_at_start
        assert stats.kv_blocks_used == 0
    finally:
        engine.shutdown()


def test_cancelling_the_task_aborts(tiny_llama):
    engine = _engine(tiny_llama)
    params = SamplingParams(max_tokens=400, temperature=0.0, ignore_eos=True)

    started = asyncio.Event()  # the request's first event came: it is running

    async def consume():
        async for _ in engine.generate(GenerationRequest("c", list(range(3, 40)), params)):
            started.set()

    async def main():
        task = asyncio.create_task(consume())
        await started.wait()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        for _ in range(200):
            if engine.stats().num_running == 0:
                return True
            await asyncio.sleep(0.01)
        return False

    try:
        assert asyncio.run(main())
    finally:
        engine.shutdown()


def test_factory_builds_the_engine_on_its_thread(tiny_llama) -> None:
    import threading

    built_on: list[str] = []

    def build() -> LLMEngine:
        built_on.append(threading.current_thread().name)
        return LLMEngine(tiny_llama, EngineConfig(block_size=4, num_kv_blocks=64))

    engine = AsyncEngine(factory=build).start()

    async def main() -> list[int]:
        await engine.wait_loaded()
        out: list[int] = []
        async for ev in engine.generate(GenerationRequest("f", [5, 6, 7], SamplingParams(max_tokens=4, temperature=0))):
            out += ev.token_ids
        return out

    try:
        assert len(asyncio.run(main())) >= 1
    finally:
        engine.shutdown()
    assert built_on == ["sluice-engine"]


def test_factory_errors_reach_the_caller():
    import pytest

    from sluice.errors import EngineDeadError, ModelLoadError

    def build() -> LLMEngine:
        raise ModelLoadError("no such model")

    engine = AsyncEngine(factory=build).start()

    async def main() -> None:
        with pytest.raises(ModelLoadError, match="no such model"):
            await engine.wait_loaded()
        assert not engine.is_running
        with pytest.raises(EngineDeadError):
            async for _ in engine.generate(GenerationRequest("x", [1], SamplingParams())):
                pass

    asyncio.run(main())
