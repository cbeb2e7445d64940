"""The engine hands greedy rows to the kernels' greedy LM head (models/kernels/packed_linear.py
argmax_logits): every token, logprob and sampled draw must be what the full head gives, in a
batch that mixes greedy rows with rows that need their whole logits."""

from __future__ import annotations

import pytest

import sluice.engine.runner as runner
from sluice.engine.config import EngineConfig
from sluice.engine.engine import LLMEngine
from sluice.types import GenerationRequest, SamplingParams
from tests.cpu import has_avx2

PROMPTS = [
    "Describe how rain forms.",
    "List three uses of copper.",
    "Write a haiku about owls.",
    "What is a prime number?",
    "Explain what a library does.",
    "Say hello in French.",
    "Name two rivers.",
    "Why is the sky blue?",
    "Count to five.",
    "What do bees make?",
    "Describe a violin.",
    "What is chess?",
    "Give a tip for sleep.",
    "Define gravity.",
]
GREEDY = 12  # the other two rows need every logit: few enough for the greedy head to take the step


def _requests(loaded) -> list[GenerationRequest]:
    ids = [loaded.tokenizer.encode_chat([{"role": "user", "content": p}]) for p in PROMPTS]
    greedy = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    reqs = [GenerationRequest(f"g{i}", p, greedy) for i, p in enumerate(ids[:GREEDY])]
    reqs.append(
        GenerationRequest(
            "lp", ids[GREEDY], SamplingParams(max_tokens=24, temperature=0.0, logprobs=3, ignore_eos=True)
        )
    )
    reqs.append(
        GenerationRequest("s", ids[GREEDY + 1], SamplingParams(max_tokens=24, temperature=0.8, seed=7, ignore_eos=True))
    )
    return reqs


def test_greedy_rows_through_the_greedy_head_give_the_full_heads_tokens(bundled, monkeypatch) -> None:
    if not has_avx2():  # as tests/unit/models/conftest.py's `ops`
        pytest.skip("the CPU lacks AVX2/FMA/F16C, so the kernels cannot run here")
    assert bundled.model.ops is not None, "the kernels failed to build or load on a CPU with AVX2 (see the log)"
    ops = bundled.model.ops
    calls: list[tuple[int, int]] = []  # (rows, argmax rows) of each greedy-head call
    real = ops.linear_q8_argmax

    def counting(x, w, n, k, bounds, rows):
        calls.append((x.shape[0], rows.numel()))
        return real(x, w, n, k, bounds, rows)

    monkeypatch.setattr(ops, "linear_q8_argmax", counting)
    config = EngineConfig(num_kv_blocks=512, speculative_tokens=0)
    got = LLMEngine(bundled, config).generate(_requests(bundled))
    assert (GREEDY + 2, GREEDY) in calls  # mixed steps went through it, the two full rows exact
    monkeypatch.setattr(runner, "_argmax_only", lambda sampling: None)  # every row through the full head
    calls.clear()
    want = LLMEngine(bundled, config).generate(_requests(bundled))
    assert not calls
    for rid in want:
        assert got[rid].token_ids == want[rid].token_ids, rid
    assert len(got["lp"].logprobs) == 24 and got["lp"].logprobs == want["lp"].logprobs
