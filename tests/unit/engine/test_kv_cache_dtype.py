"""The opt-in 16-bit K/V cache (EngineConfig.kv_cache_dtype = float16): the pool stores half the
bytes, the engine runs on both paths, and greedy output stays close to the fp32 cache's (it is
not exact: each K/V value is rounded to fp16 once; the deviation over many prompts is measured
by bench/kernels/numerics_quality.py, docs/BENCHMARKS.md)."""

from __future__ import annotations

import pytest
import torch

from sluice.engine.config import EngineConfig
from sluice.engine.engine import LLMEngine
from sluice.types import GenerationRequest, SamplingParams

PROMPTS = ["What is the capital of France?", "Write a short poem about autumn leaves falling in a quiet park."]
TOKENS = 24


def _greedy(engine: LLMEngine, prompts: list[list[int]]) -> list[list[int]]:
    params = SamplingParams(max_tokens=TOKENS, temperature=0.0, ignore_eos=True)
    reqs = [GenerationRequest(f"r{i}", p, params) for i, p in enumerate(prompts)]
    out = engine.generate(reqs)
    return [out[r.request_id].token_ids for r in reqs]


def test_the_setting_is_checked():
    with pytest.raises(ValueError, match="kv_cache_dtype"):
        EngineConfig(kv_cache_dtype="int8")


def test_a_16_bit_cache_halves_the_pool_and_stays_close(bundled):
    # the default path (the CPU kernels where they build); the torch backend reading a 16-bit
    # cache is checked against the kernel in tests/unit/models/test_kernels.py
    prompts = [bundled.tokenizer.encode_chat([{"role": "user", "content": p}]) for p in PROMPTS]
    full = LLMEngine(bundled, EngineConfig(num_kv_blocks=64))
    half = LLMEngine(bundled, EngineConfig(num_kv_blocks=64, kv_cache_dtype="float16"))
    assert all(k.dtype == torch.float16 and v.dtype == torch.float16 for k, v in half.runner.kv_caches)
    assert full.runner.kv_caches[0][0].dtype == torch.float32
    assert half._kv_bytes_per_block * 2 == full._kv_bytes_per_block
    ref, got = _greedy(full, prompts), _greedy(half, prompts)
    assert all(len(g) == TOKENS for g in got)
    # the first tokens agree (rounding K/V to 11 significant bits moves logits by ~1e-3 here)
    assert all(r[:4] == g[:4] for r, g in zip(ref, got)), (ref, got)
