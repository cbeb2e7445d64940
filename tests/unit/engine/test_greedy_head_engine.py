"""The engine hands greedy rows to the kernels' greedy LM head (models/kernels/packed_linear.py
argmax_logits): every token, logprob and sampled draw must be what the full head gives, in a
batch that mixes greedy rows with rows that need their whole logits."""

from __future__ import annotations

import pytest

import sluice.engine.runner as runner
from sluice.engine.config import EngineConfig
from sluice.engine.engine import LLMEngine
from sluice.models.kernels.packed_linear import PackedLinear
from sluice.types import GenerationRequest, SamplingParams
from tests.cpu import has_avx2

PROMPTS = ["Describe how rain forms.", "List three uses of copper.", "Write a haiku about owls.",
           "What is a prime number?", "Explain what a library does.", "Say hello in French."]


def _requests(loaded) -> list[GenerationRequest]:
    ids = [loaded.tokenizer.encode_chat([{"role": "user", "content": p}]) for p in PROMPTS]
    greedy = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    reqs = [GenerationRequest(f"g{i}", p, greedy) for i, p in enumerate(ids[:4])]
    reqs.append(GenerationRequest("lp", ids[4], SamplingParams(max_tokens=24, temperature=0.0, logprobs=3, ignore_eos=True)))
    reqs.append(GenerationRequest("s", ids[5], SamplingParams(max_tokens=24, temperature=0.8, seed=7, ignore_eos=True)))
    return reqs


def test_greedy_rows_through_the_greedy_head_give_the_full_heads_tokens(bundled, monkeypatch):
    if not has_avx2() or bundled.model.ops is None:
        pytest.skip("the CPU kernels are not in use here")
    calls: list[int] = []
    real = PackedLinear.argmax_logits

    def counting(self, x, rows):  # noqa: ANN001, ANN202
        calls.append(rows.numel())
        return real(self, x, rows)

    monkeypatch.setattr(PackedLinear, "argmax_logits", counting)
    config = EngineConfig(num_kv_blocks=256, speculative_tokens=0)
    got = LLMEngine(bundled, config).generate(_requests(bundled))
    assert calls and max(calls) >= 4  # the greedy rows went through it, the others did not
    monkeypatch.setattr(runner, "_argmax_only", lambda sampling: None)  # every row through the full head
    calls.clear()
    want = LLMEngine(bundled, config).generate(_requests(bundled))
    assert not calls
    for rid in want:
        assert got[rid].token_ids == want[rid].token_ids, rid
    assert len(got["lp"].logprobs) == 24 and got["lp"].logprobs == want["lp"].logprobs
