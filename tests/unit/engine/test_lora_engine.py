"""LoRA in the engine, on a tiny random Llama folder and adapters PEFT itself made: each row's
greedy output equals transformers + PEFT's for its adapter (base rows: transformers'), in one
batch mixing base rows with three adapters while requests come, go and are preempted, on both
paths; the prefix cache never crosses adapters; max_loras and max_cpu_loras hold; damaged
adapters are refused with a clear error and the engine keeps serving."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from sluice.engine.config import EngineConfig
from sluice.engine.engine import LLMEngine
from sluice.errors import AdapterError
from sluice.models.loader import load_model
from sluice.types import AdapterRef, GenerationRequest, SamplingParams
from tests.cpu import has_avx2
from tests.lora_adapters import peft_adapter, peft_reference
from tests.reference import compare, hf_greedy

MAX_TOKENS = 24
PROMPTS = [[3 + (7 * i + j * 13) % 250 for j in range(n)] for i, n in enumerate([5, 17, 40, 9, 26, 33, 12])]
# which adapter each prompt runs with (None: the base model)
PLAN = [None, "a1", "a2", "a3", "a1", None, "a3"]


@pytest.fixture(scope="module")
def hf(tiny_llama_dir):
    import transformers

    return transformers.AutoModelForCausalLM.from_pretrained(str(tiny_llama_dir), dtype="float32").eval()


@pytest.fixture(scope="module")
def adapters(hf, tmp_path_factory):
    root = tmp_path_factory.mktemp("adapters")
    return {
        "a1": peft_adapter(hf, root / "a1", rank=8, seed=1, std=0.2),
        "a2": peft_adapter(hf, root / "a2", rank=4, seed=2, std=0.3, targets=("q_proj", "v_proj"), use_rslora=True),
        "a3": peft_adapter(
            hf, root / "a3", rank=16, alpha=8, seed=3, std=0.15, targets=("o_proj", "gate_proj", "up_proj", "down_proj")
        ),
    }


@pytest.fixture(scope="module")
def references(hf, adapters):
    models = {None: hf, **{name: peft_reference(hf, path) for name, path in adapters.items()}}
    return {i: hf_greedy(models[name], p, MAX_TOKENS, eos=2) for i, (p, name) in enumerate(zip(PROMPTS, PLAN))}


def _request(i: int, adapters, name: str | None = None, **kw) -> GenerationRequest:
    name = PLAN[i] if name is None else name
    ref = AdapterRef(name, str(adapters[name])) if name else None
    return GenerationRequest(
        f"r{i}-{name}", PROMPTS[i], SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0), adapter=ref, **kw
    )


def _engine(folder, kernels: str, **config) -> LLMEngine:
    loaded = load_model(folder, progress=False, kernels=kernels)
    assert loaded.model.uses_kernels == (kernels == "auto" and has_avx2())
    return LLMEngine(loaded, EngineConfig(block_size=4, **{"num_kv_blocks": 512, **config}))


@pytest.mark.parametrize("kernels, speculative", [("auto", 0), ("torch", 0), ("auto", 3)])
def test_one_batch_of_base_and_three_adapters_equals_peft(kernels, speculative, tiny_llama_dir, adapters, references):
    """Speculative decoding too: a proposal's rows run with their request's adapter."""
    engine = _engine(tiny_llama_dir, kernels, max_num_batched_tokens=32, speculative_tokens=speculative)
    reqs = [_request(i, adapters) for i in range(len(PROMPTS))]
    results = engine.generate(reqs)
    assert engine.stats().lora_loads == 3, "each adapter loaded once and shared"
    for i, r in enumerate(reqs):
        assert compare(references[i], results[r.request_id].token_ids, f"{kernels} prompt {i} ({PLAN[i]})") is None


@pytest.mark.parametrize("kernels", ["auto", "torch"])
def test_exact_while_requests_come_go_and_are_preempted(kernels, tiny_llama_dir, adapters, references) -> None:
    """Requests join mid-stream, one is aborted, and a small KV pool preempts: every survivor's
    tokens still equal its reference."""
    engine = _engine(tiny_llama_dir, kernels, max_num_batched_tokens=16, num_kv_blocks=40)
    got: dict[str, list[int]] = {}
    first, later = [0, 2, 3, 6], [1, 4, 5]
    for i in first:
        engine.add_request(_request(i, adapters))
    engine.add_request(
        GenerationRequest(
            "doomed",
            PROMPTS[5],
            SamplingParams(max_tokens=40, temperature=0.0),
            adapter=AdapterRef("a2", str(adapters["a2"])),
        )
    )
    steps = 0
    while engine.has_unfinished():
        if steps == 3:
            for i in later:
                engine.add_request(_request(i, adapters))
        if steps == 6:
            engine.abort_request("doomed")
        for ev in engine.step():
            got.setdefault(ev.request_id, []).extend(ev.token_ids)
        steps += 1
    assert engine.stats().num_preemptions > 0, "the pool is small enough to preempt"
    for i in range(len(PROMPTS)):
        rid = _request(i, adapters).request_id
        assert compare(references[i], got[rid], f"{kernels} prompt {i}") is None


def test_prefix_cache_is_namespaced_by_adapter(tiny_llama_dir, adapters):
    """A prefix cached under adapter a1 is never reused for a2 or for the base model; a1 again
    hits it."""
    engine = _engine(tiny_llama_dir, "auto")
    prompt = PROMPTS[2]  # 40 tokens: 9 full blocks of 4 can hit

    def cached(name: str | None, rid: str) -> int:
        ref = AdapterRef(name, str(adapters[name])) if name else None
        req = GenerationRequest(rid, prompt, SamplingParams(max_tokens=2, temperature=0.0), adapter=ref)
        return engine.generate([req])[rid].usage.cached_tokens

    assert cached("a1", "first") == 0
    assert cached("a2", "other-adapter") == 0
    assert cached(None, "base") == 0
    assert cached("a1", "again") >= 36, "the same adapter reuses its own prefix"
    assert cached(None, "base-again") >= 36, "and the base its own"


def test_at_most_max_loras_adapters_run_at_once(tiny_llama_dir, adapters):
    engine = _engine(tiny_llama_dir, "auto", max_loras=2, max_cpu_loras=2)
    reqs = [_request(i, adapters) for i in range(len(PROMPTS))]
    for r in reqs:
        engine.add_request(r)
    seen = 0
    while engine.has_unfinished():
        out = engine.scheduler.schedule()
        distinct = {c.request.adapter for c in out.chunks if c.request.adapter is not None}
        assert len(distinct) <= 2 and len(out.adapters) == len(distinct)
        assert all(
            c.lora_slot == (-1 if c.request.adapter is None else out.adapters.index(c.request.adapter))
            for c in out.chunks
        )
        seen = max(seen, len(distinct))
        sampled = engine._execute(out)
        for chunk in out.chunks:
            chunk.request.num_computed_tokens = chunk.end
        engine._append_sampled(out, sampled)
    assert seen == 2


def test_evicted_adapters_reload_transparently(tiny_llama_dir, adapters, references):
    """max_cpu_loras = 1: each new adapter evicts the last one; asking for an evicted adapter
    loads it again and gives the same tokens."""
    engine = _engine(tiny_llama_dir, "auto", max_loras=1, max_cpu_loras=1)
    order = [1, 2, 3, 4]  # a1, a2, a3, a1 again
    for i in order:
        r = _request(i, adapters)
        tokens = engine.generate([r])[r.request_id].token_ids
        assert compare(references[i], tokens, f"prompt {i}") is None
        assert len(engine.adapters.resident()) == 1
    stats = engine.stats()
    assert stats.lora_loads == 4 and stats.lora_evictions == 3
    assert stats.lora_resident == ["a1"]


def _damaged(tmp_path, adapters, how: str):
    folder = tmp_path / how
    shutil.copytree(adapters["a1"], folder)
    cfg = folder / "adapter_config.json"
    weights = folder / "adapter_model.safetensors"
    if how == "bad_json":
        cfg.write_text(cfg.read_text()[:-20])
    elif how == "no_weights":
        weights.unlink()
    elif how == "truncated":
        weights.write_bytes(weights.read_bytes()[:5000])
    elif how == "rank_mismatch":
        raw = json.loads(cfg.read_text())
        cfg.write_text(json.dumps({**raw, "r": 4}))
    elif how == "unknown_target":
        raw = json.loads(cfg.read_text())
        cfg.write_text(json.dumps({**raw, "target_modules": ["q_proj", "lm_head"]}))
    elif how == "wrong_shape":
        from safetensors.torch import load_file, save_file

        tensors = load_file(str(weights))
        key = next(k for k in tensors if "q_proj.lora_B" in k)
        tensors[key] = torch.zeros(32, 8)
        save_file(tensors, str(weights))
    elif how == "nan":
        from safetensors.torch import load_file, save_file

        tensors = load_file(str(weights))
        key = next(k for k in tensors if "down_proj.lora_A" in k)
        tensors[key][0, 0] = float("nan")
        save_file(tensors, str(weights))
    elif how == "dora":
        raw = json.loads(cfg.read_text())
        cfg.write_text(json.dumps({**raw, "use_dora": True}))
    return folder


@pytest.mark.parametrize(
    "how, message",
    [
        ("bad_json", "not valid JSON"),
        ("no_weights", "adapter_model.safetensors is missing"),
        ("truncated", "not a readable safetensors file"),
        ("rank_mismatch", "rank mismatch"),
        ("unknown_target", "'lm_head' is not a linear of this base model"),
        ("wrong_shape", "do not fit the base model's q_proj"),
        ("dora", "DoRA"),
        ("nan", "down_proj.lora_A.weight' holds non-finite values"),
    ],
)
def test_a_damaged_adapter_is_refused_and_the_engine_keeps_serving(
    how, message, tiny_llama_dir, adapters, references, tmp_path
):
    engine = _engine(tiny_llama_dir, "auto")
    bad = _damaged(tmp_path, adapters, how)
    with pytest.raises(AdapterError, match=message):
        engine.add_request(
            GenerationRequest("bad", PROMPTS[0], SamplingParams(max_tokens=4), adapter=AdapterRef("bad", str(bad)))
        )
    assert not engine.has_unfinished() and engine.adapters.resident() == []
    r = _request(1, adapters)
    assert compare(references[1], engine.generate([r])[r.request_id].token_ids, "after a refusal") is None


def test_an_engine_without_lora_refuses_adapters(tiny_llama_dir, adapters):
    from sluice.errors import InvalidRequestError

    engine = _engine(tiny_llama_dir, "auto", max_loras=0)
    with pytest.raises(InvalidRequestError, match="max_loras = 0"):
        engine.add_request(_request(1, adapters))
