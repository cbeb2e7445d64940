"""Bad input gets a clear error naming the problem — never a hang, never a dead engine loop."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys

import pytest

from sluice.engine.async_engine import AsyncEngine
from sluice.engine.config import EngineConfig
from sluice.engine.engine import LLMEngine
from sluice.errors import ContextWindowExceededError, InvalidRequestError, ModelLoadError
from sluice.models.loader import default_model_path, load_model
from sluice.types import FinishReason, GenerationRequest, SamplingParams


@pytest.fixture(scope="module")
def engine(tiny_llama) -> LLMEngine:
    return LLMEngine(tiny_llama, EngineConfig(block_size=4, num_kv_blocks=64))


@pytest.mark.parametrize(
    "prompt, sampling, match",
    [
        ([], SamplingParams(), "prompt is empty"),
        ([1, 2], SamplingParams(max_tokens=0), "max_tokens"),
        ([1, 2], SamplingParams(temperature=-1), "temperature"),
        ([1, 2], SamplingParams(top_p=0), "top_p"),
        ([1, 2], SamplingParams(top_p=1.5), "top_p"),
        ([1, 2], SamplingParams(top_k=-2), "top_k"),
        ([1, 2], SamplingParams(stop=("",)), "stop"),
        ([1, 10**6], SamplingParams(), "outside the vocabulary"),
        ([1, -1], SamplingParams(), "outside the vocabulary"),
        ([1, 2], SamplingParams(temperature=float("nan")), "temperature"),
        ([1, 2], SamplingParams(top_p=float("nan")), "top_p"),
    ],
)
def test_bad_requests_are_named(engine, prompt, sampling, match):
    with pytest.raises(InvalidRequestError, match=match):
        engine.add_request(GenerationRequest("bad", prompt, sampling))
    assert "bad" not in engine.requests


def test_prompt_over_the_context_window(engine):
    assert issubclass(ContextWindowExceededError, InvalidRequestError)  # API layers map it as a 400
    with pytest.raises(ContextWindowExceededError, match="prompt is too long"):
        engine.add_request(GenerationRequest("long", [5] * engine.max_model_len, SamplingParams()))
    # the boundary: a prompt that leaves room for exactly one output token is served
    out = engine.generate([GenerationRequest("edge", [5] * (engine.max_model_len - 1), SamplingParams(max_tokens=4))])
    assert out["edge"].finished and len(out["edge"].token_ids) == 1


def test_duplicate_request_id(engine):
    engine.add_request(GenerationRequest("dup", [5, 6], SamplingParams(max_tokens=2)))
    with pytest.raises(InvalidRequestError, match="already in use"):
        engine.add_request(GenerationRequest("dup", [5, 6], SamplingParams(max_tokens=2)))
    while engine.has_unfinished():
        engine.step()


def test_model_paths(tmp_path, tiny_llama_dir):
    with pytest.raises(ModelLoadError, match="does not exist"):
        load_model(tmp_path / "missing.gguf")
    with pytest.raises(ModelLoadError, match="config.json"):
        load_model(tmp_path)  # a folder without config.json
    odd = tmp_path / "weights.bin"
    odd.write_bytes(b"x")
    with pytest.raises(ModelLoadError, match="neither a .gguf file nor a model folder"):
        load_model(odd)
    with pytest.raises(ModelLoadError, match="unknown dtype"):
        load_model(tiny_llama_dir, dtype="int3")


def test_corrupt_gguf(tmp_path):
    garbage = tmp_path / "garbage.gguf"
    garbage.write_bytes(b"this is not a gguf file at all" * 10)
    with pytest.raises(ModelLoadError, match="not a valid GGUF"):
        load_model(garbage)
    truncated = tmp_path / "truncated.gguf"
    with open(default_model_path(), "rb") as f:
        truncated.write_bytes(f.read(200_000))  # the header and part of the metadata
    with pytest.raises(ModelLoadError, match="GGUF"):
        load_model(truncated)


def test_corrupt_safetensors_folder(tmp_path, tiny_llama_dir):
    broken = tmp_path / "broken"
    shutil.copytree(tiny_llama_dir, broken)
    for f in broken.glob("*.safetensors"):
        f.write_bytes(b"\x00\x01garbage")
    with pytest.raises(ModelLoadError, match="cannot read"):
        load_model(broken)
    missing = tmp_path / "missing"
    shutil.copytree(tiny_llama_dir, missing)
    for f in missing.glob("*.safetensors"):
        f.unlink()
    with pytest.raises(ModelLoadError, match="safetensors"):
        load_model(missing)


def test_unsupported_architecture(tmp_path, tiny_llama_dir):
    odd = tmp_path / "odd"
    shutil.copytree(tiny_llama_dir, odd)
    cfg = json.loads((odd / "config.json").read_text())
    cfg["model_type"] = "gpt_bigcode"
    cfg["architectures"] = ["GPTBigCodeForCausalLM"]
    (odd / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelLoadError, match="gpt_bigcode|GPTBigCode|unsupported"):
        load_model(odd)


def test_async_engine_survives_bad_requests_and_a_failed_step(tiny_llama, monkeypatch):
    llm = LLMEngine(tiny_llama, EngineConfig(block_size=4, num_kv_blocks=128))
    engine = AsyncEngine(llm).start()
    params = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)

    async def collect(rid: str) -> tuple[list[int], FinishReason | None]:
        tokens: list[int] = []
        reason = None
        async for ev in engine.generate(GenerationRequest(rid, [4, 5, 6, 7], params)):
            tokens += ev.token_ids
            reason = ev.finish_reason
        return tokens, reason

    async def bad() -> None:
        await asyncio.sleep(0.01)
        with pytest.raises(InvalidRequestError):
            async for _ in engine.generate(GenerationRequest("bad", [], params)):
                pass

    async def main():
        return await asyncio.gather(collect("a"), collect("b"), bad())

    try:
        (a, ra), (b, rb), _ = asyncio.run(main())
        assert ra is rb is FinishReason.LENGTH and len(a) == len(b) == 12  # the others kept running

        real_execute = llm.runner.execute
        calls = {"n": 0}

        def flaky(out):  # the third step of request "c" fails, and so does its retry alone
            if any(ch.request.request_id == "c" for ch in out.chunks):
                calls["n"] += 1
                if calls["n"] >= 3:
                    raise RuntimeError("simulated device fault")
            return real_execute(out)

        monkeypatch.setattr(llm.runner, "execute", flaky)
        (_, r1) = asyncio.run(collect("c"))
        assert r1 is FinishReason.ERROR  # the failing step's request fails, with a reason
        (tokens, r2) = asyncio.run(collect("d"))
        assert r2 is FinishReason.LENGTH and len(tokens) == 12  # and the engine keeps serving
        assert engine.is_running
    finally:
        engine.shutdown()


def test_cli_bad_model_path(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "sluice.cli", "generate", "--prompt", "hi", "--model", str(tmp_path / "nope.gguf")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1].startswith("sluice: error:") and "does not exist" in result.stderr
    assert "Traceback" not in result.stderr


def test_failed_step_leaves_no_poisoned_prefix_cache(tiny_llama, monkeypatch):
    """A step that raises fails its requests; the blocks it had registered in the prefix cache
    (for tokens scheduled but never computed) must not serve a later request (regression: the
    next request with the same prompt used to hit them and attend to never-written K/V)."""
    prompt = [(11 * i) % 200 + 3 for i in range(24)]
    params = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
    clean = LLMEngine(tiny_llama, EngineConfig(block_size=4, num_kv_blocks=64))
    expected = clean.generate([GenerationRequest("ref", prompt, params)])["ref"].token_ids

    engine = LLMEngine(tiny_llama, EngineConfig(block_size=4, num_kv_blocks=64))
    real_execute = engine.runner.execute
    calls = {"n": 0}

    def fail_first(out):  # the first step fails, and so does its retry alone (the engine's isolation)
        calls["n"] += 1
        if calls["n"] <= 2:
            raise RuntimeError("simulated device fault")
        return real_execute(out)

    monkeypatch.setattr(engine.runner, "execute", fail_first)
    failed = engine.generate([GenerationRequest("victim", prompt, params)])["victim"]
    assert failed.finish_reason is FinishReason.ERROR and "simulated device fault" in (failed.error or "")
    assert engine.stats().kv_blocks_used == 0
    again = engine.generate([GenerationRequest("again", prompt, params)])["again"]
    assert again.usage.cached_tokens == 0  # nothing of the failed step may be served from cache
    assert again.token_ids == expected


def test_async_duplicate_id_fails_only_the_duplicate(tiny_llama):
    """The duplicate check runs on the engine thread; it must fail the second caller only."""
    llm = LLMEngine(tiny_llama, EngineConfig(block_size=4, num_kv_blocks=128))
    engine = AsyncEngine(llm).start()
    params = SamplingParams(max_tokens=40, temperature=0, ignore_eos=True)

    async def first() -> tuple[int, FinishReason | None]:
        n, reason = 0, None
        async for ev in engine.generate(GenerationRequest("same", [4, 5, 6], params)):
            n += len(ev.token_ids)
            reason = ev.finish_reason
        return n, reason

    async def second() -> None:
        # submitted right behind the first (gather starts it next), long before 40 steps are done
        with pytest.raises(InvalidRequestError, match="already in use"):
            async for _ in engine.generate(GenerationRequest("same", [7, 8], params)):
                pass

    async def main():
        return await asyncio.gather(first(), second())

    try:
        (n, reason), _ = asyncio.run(asyncio.wait_for(main(), 60))
        assert n == 40 and reason is FinishReason.LENGTH

        async def too_long() -> None:
            async for _ in engine.generate(GenerationRequest("huge", [5] * llm.max_model_len, params)):
                pass

        with pytest.raises(ContextWindowExceededError):  # validated before anything is queued
            asyncio.run(too_long())
        assert engine.is_running and not llm.requests
    finally:
        engine.shutdown()


def test_a_fault_in_one_request_fails_it_alone_and_its_batch_goes_on(tiny_llama):
    """Partial batch failure: a step that raises is split into its requests; only the one whose
    own step fails ends with ERROR, the others run on to the same tokens they get alone
    (`fail_seed`: the worker's testing aid that makes one request's step raise, worker/faults.py)."""
    from sluice.worker.faults import FaultSpec

    params = [SamplingParams(max_tokens=12, temperature=0.7, seed=s) for s in (11, 13, 17)]
    prompts = [[5, 6, 7], [8, 9, 10, 11], [12, 13]]
    alone = LLMEngine(tiny_llama, EngineConfig(block_size=4, num_kv_blocks=64))
    expected = {
        f"r{i}": alone.generate([GenerationRequest(f"r{i}", p, s)])[f"r{i}"].token_ids
        for i, (p, s) in enumerate(zip(prompts, params))
    }
    faulty = LLMEngine(tiny_llama, EngineConfig(block_size=4, num_kv_blocks=64))
    FaultSpec(fail_seed=13).install_on_engine(faulty)
    out = faulty.generate([GenerationRequest(f"r{i}", p, s) for i, (p, s) in enumerate(zip(prompts, params))])
    assert out["r1"].finish_reason is FinishReason.ERROR and "injected fault" in (out["r1"].error or "")
    assert out["r0"].token_ids == expected["r0"] and out["r2"].token_ids == expected["r2"]
    assert faulty.kv.num_free_blocks == faulty.kv.num_usable_blocks  # nothing leaked
