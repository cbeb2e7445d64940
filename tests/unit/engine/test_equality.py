"""Greedy output equals transformers' greedy output, token for token (fp32), on both of sluice's
paths: the CPU kernels (the default) and the portable torch fallback."""

from __future__ import annotations

import warnings

import pytest

from sluice.engine.config import EngineConfig
from sluice.engine.engine import LLMEngine
from sluice.models.loader import load_model
from sluice.types import GenerationRequest, SamplingParams
from tests.cpu import has_avx2
from tests.reference import compare, hf_greedy

CHAT_PROMPTS = [
    "Hi!",
    "What is the capital of France?",
    "Write a short poem about autumn leaves falling in a quiet park.",
    "Explain, step by step, how a bicycle stays upright while moving, and why it falls over when it stops. "
    "Mention gyroscopic effects, trail, and the rider's steering corrections.",
    "You are given a list of tasks for a small software team: write the API, design the database schema, "
    "set up continuous integration, write documentation, add monitoring, run a load test, fix the flaky tests, "
    "and plan the next release. Order them sensibly for a two-week sprint and say in one sentence why each "
    "comes where it does. Keep the whole answer under one hundred words.",
    "Translate 'good morning' into Spanish.",
]


def _run_batch(engine: LLMEngine, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
    reqs = [
        GenerationRequest(f"r{i}", p, SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=False))
        for i, p in enumerate(prompts)
    ]
    results = engine.generate(reqs)
    return [results[r.request_id].token_ids for r in reqs]


def _check(notes: list[str | None]) -> None:
    for note in filter(None, notes):
        warnings.warn(note, stacklevel=2)
        print(note)


# A second set: code, arithmetic, lists, other languages, a long system prompt, a one-word ask.
EXTRA_PROMPTS = [
    ("You are a terse assistant who answers in one line.", "Name three prime numbers larger than 50."),
    (None, "Write a Python function that returns the factorial of n, with a docstring."),
    (None, "What is 17 times 23? Show the steps."),
    (None, "List five fruits that are red, one per line."),
    (None, "Écris une phrase en français sur la mer."),
    (
        "You are a helpful assistant. Always answer politely, keep answers short, avoid jargon, and if you do "
        "not know something, say so plainly instead of guessing.",
        "Why is the sky blue?",
    ),
    (None, "Summarize the plot of Romeo and Juliet in two sentences."),
    (None, "Continue the sequence: 2, 4, 8, 16,"),
]
_hf_cache: dict[tuple[int, ...], object] = {}


def _hf(hf_bundled, prompt: list[int], n: int, eos):  # the reference is the same for both paths
    key = (n, *prompt)
    if key not in _hf_cache:
        _hf_cache[key] = hf_greedy(hf_bundled, prompt, n, eos=eos)
    return _hf_cache[key]


@pytest.mark.slow
def test_bundled_model_matches_transformers_in_one_mixed_batch(bundled_on_path, hf_bundled):
    bundled = bundled_on_path
    tok = bundled.tokenizer
    prompts = [tok.encode_chat([{"role": "user", "content": p}]) for p in CHAT_PROMPTS]
    assert len({len(p) for p in prompts}) >= 5, "prompts of different lengths"
    assert max(len(p) for p in prompts) > 100
    # a 64-token budget chunks the long prompts across steps while short ones already decode
    engine = LLMEngine(bundled, EngineConfig(max_num_batched_tokens=64, num_kv_blocks=256))
    got = _run_batch(engine, prompts, max_tokens=48)
    stats = engine.stats()
    assert stats.num_steps > 48  # really interleaved, not one prompt after another
    notes = []
    for i, (prompt, tokens) in enumerate(zip(prompts, got)):
        ref = _hf(hf_bundled, prompt, 48, tok.eos_token_ids)
        notes.append(compare(ref, tokens, f"bundled prompt {i}"))
    _check(notes)


@pytest.mark.slow
def test_bundled_model_matches_transformers_on_a_second_prompt_set(bundled_on_path, hf_bundled):
    bundled = bundled_on_path
    tok = bundled.tokenizer
    prompts = [
        tok.encode_chat(([{"role": "system", "content": s}] if s else []) + [{"role": "user", "content": u}])
        for s, u in EXTRA_PROMPTS
    ]
    engine = LLMEngine(bundled, EngineConfig(num_kv_blocks=512))
    got = _run_batch(engine, prompts, max_tokens=64)
    notes = []
    for i, (prompt, tokens) in enumerate(zip(prompts, got)):
        notes.append(compare(_hf(hf_bundled, prompt, 64, tok.eos_token_ids), tokens, f"extra prompt {i}"))
    _check(notes)


@pytest.mark.parametrize("kernels", ["auto", "torch"])
@pytest.mark.parametrize("arch", ["llama", "qwen2", "mistral"])
def test_tiny_random_folders_match_transformers(arch, kernels, request):
    import transformers

    folder = request.getfixturevalue(f"tiny_{arch}_dir")
    loaded = load_model(folder, progress=False, kernels=kernels)
    assert loaded.model.uses_kernels == (kernels == "auto" and has_avx2())
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(folder), dtype="float32").eval()
    prompts = [[3 + (7 * i + j * 13) % 250 for j in range(n)] for i, n in enumerate([5, 17, 40, 63, 90])]
    engine = LLMEngine(loaded, EngineConfig(block_size=4, max_num_batched_tokens=32, num_kv_blocks=512))
    got = _run_batch(engine, prompts, max_tokens=40)
    notes = []
    for i, (prompt, tokens) in enumerate(zip(prompts, got)):
        ref = hf_greedy(hf, prompt, 40, eos=2)
        notes.append(compare(ref, tokens, f"{arch} prompt {i}"))
    _check(notes)
