"""The model and the engine on a CUDA device: greedy output equals transformers' (fp32), the
half-precision dtypes answer sensibly, and a short engine run keeps its guarantees there.

Skipped, with the reason, where torch sees no CUDA device (CI, CPU hosts, a CPU-only torch
build). The device-agnostic parts of the same code run everywhere in tests/system/worker/test_device.py.
"""

from __future__ import annotations

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)

from sluice.engine.config import EngineConfig  # noqa: E402
from sluice.engine.engine import LLMEngine  # noqa: E402
from sluice.models.loader import load_model  # noqa: E402
from sluice.models.sdpa_attention import SdpaPagedAttention  # noqa: E402
from sluice.types import GenerationRequest, SamplingParams  # noqa: E402
from tests.reference import compare, hf_greedy  # noqa: E402
from tests.unit.engine.test_equality import CHAT_PROMPTS, EXTRA_PROMPTS, _check, _hf, _run_batch  # noqa: E402

CUDA = "cuda"


@pytest.fixture(scope="module")
def bundled_cuda():
    return load_model(progress=False, device=CUDA)


def test_the_bundled_model_loads_onto_the_gpu(bundled_cuda):
    model = bundled_cuda.model
    assert model.device.type == "cuda" and not model.uses_kernels
    assert isinstance(model.attention, SdpaPagedAttention)
    assert model.norm.device.type == "cuda" and model.rope_cos.device.type == "cuda"
    engine = LLMEngine(bundled_cuda, EngineConfig(num_kv_blocks=64))
    assert all(k.is_cuda and v.is_cuda for k, v in engine.runner.kv_caches)


def test_auto_picks_the_gpu():
    loaded = load_model(progress=False, device="auto")
    assert loaded.model.device.type == "cuda"


@pytest.mark.slow
def test_bundled_model_on_cuda_matches_transformers_in_one_mixed_batch(bundled_cuda, hf_bundled):
    tok = bundled_cuda.tokenizer
    prompts = [tok.encode_chat([{"role": "user", "content": p}]) for p in CHAT_PROMPTS]
    engine = LLMEngine(bundled_cuda, EngineConfig(max_num_batched_tokens=64, num_kv_blocks=256))
    got = _run_batch(engine, prompts, max_tokens=48)
    assert engine.stats().num_steps > 48  # chunked prefill interleaved with decodes
    _check([compare(_hf(hf_bundled, p, 48, tok.eos_token_ids), t, f"cuda prompt {i}")
            for i, (p, t) in enumerate(zip(prompts, got))])


@pytest.mark.slow
def test_bundled_model_on_cuda_matches_transformers_on_the_second_prompt_set(bundled_cuda, hf_bundled):
    tok = bundled_cuda.tokenizer
    prompts = [tok.encode_chat(([{"role": "system", "content": s}] if s else []) + [{"role": "user", "content": u}])
               for s, u in EXTRA_PROMPTS]
    got = _run_batch(LLMEngine(bundled_cuda, EngineConfig(num_kv_blocks=512)), prompts, max_tokens=64)
    _check([compare(_hf(hf_bundled, p, 64, tok.eos_token_ids), t, f"cuda extra prompt {i}")
            for i, (p, t) in enumerate(zip(prompts, got))])


@pytest.mark.parametrize("arch", ["llama", "qwen2", "mistral"])
def test_tiny_random_folders_on_cuda_match_transformers(arch, request):
    import transformers

    folder = request.getfixturevalue(f"tiny_{arch}_dir")
    loaded = load_model(folder, progress=False, device=CUDA)
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(folder), dtype="float32").eval()
    prompts = [[3 + (7 * i + j * 13) % 250 for j in range(n)] for i, n in enumerate([5, 17, 40, 63, 90])]
    engine = LLMEngine(loaded, EngineConfig(block_size=4, max_num_batched_tokens=32, num_kv_blocks=512))
    got = _run_batch(engine, prompts, max_tokens=40)
    _check([compare(hf_greedy(hf, p, 40, eos=2), t, f"cuda {arch} prompt {i}") for i, (p, t) in enumerate(zip(prompts, got))])


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_half_precision_on_cuda_answers_the_question(dtype):
    loaded = load_model(progress=False, device=CUDA, dtype=dtype)
    assert loaded.model.dtype == getattr(torch, dtype)
    engine = LLMEngine(loaded, EngineConfig(num_kv_blocks=128))
    assert all(k.dtype == loaded.model.dtype for k, _ in engine.runner.kv_caches)
    prompt = loaded.tokenizer.encode_chat([{"role": "user", "content": "What is the capital of France?"}])
    [tokens] = _run_batch(engine, [prompt], max_tokens=20)
    assert "Paris" in loaded.tokenizer.decode(tokens)


def test_a_short_engine_run_on_cuda(bundled_cuda):
    """Mixed greedy and seeded sampling, prefix hits and preemption on a small pool: every request
    finishes at its full length, and a run repeats itself token for token. (Not compared with
    each request alone: cuBLAS may choose its kernel by batch size, so a row's logits can differ
    in the last bits with its neighbours on a GPU; docs/ENGINE.md, "The GPU path".)"""
    tok = bundled_cuda.tokenizer
    head = "You are a careful assistant. Answer in full sentences and explain your reasoning. "
    prompts = [tok.encode_chat([{"role": "user", "content": head + q}])
               for q in ("Why do cats purr?", "How do tides work?", "What is a prime number?", "Name a red fruit.")]
    params = [SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True),
              SamplingParams(max_tokens=40, temperature=0.8, top_p=0.9, seed=7, ignore_eos=True),
              SamplingParams(max_tokens=40, temperature=1.0, top_k=20, seed=11, ignore_eos=True),
              SamplingParams(max_tokens=40, temperature=0.7, top_k=50, top_p=0.95, seed=3, ignore_eos=True)]

    def run(config: EngineConfig) -> tuple[list[list[int]], LLMEngine]:
        engine = LLMEngine(bundled_cuda, config)
        reqs = [GenerationRequest(f"r{i}", p, s) for i, (p, s) in enumerate(zip(prompts, params))]
        results = engine.generate(reqs)
        return [results[r.request_id].token_ids for r in reqs], engine

    first, engine = run(EngineConfig(num_kv_blocks=256))
    assert all(len(t) == 40 for t in first)
    assert engine.stats().prefix_cache_hits > 0  # the shared head was computed once
    assert run(EngineConfig(num_kv_blocks=256))[0] == first
    # a pool far too small for all four at full length: preemption by recompute
    blocks = sum(-(-(len(p) + 40) // 8) for p in prompts) // 2
    squeezed, engine = run(EngineConfig(num_kv_blocks=blocks))
    assert all(len(t) == 40 for t in squeezed)
    assert engine.stats().num_preemptions > 0
