"""Logprobs from the engine equal transformers' log-softmax on the same model (fp32).

Output-token logprobs are the model's distribution before sampling shapes it (temperature,
top-k/p); prompt logprobs cover every prompt token after the first, across prefill chunks and
never from the prefix cache; a request that does not ask gets none.
"""

from __future__ import annotations

import pytest
import torch

from sluice.engine.config import EngineConfig
from sluice.engine.engine import LLMEngine
from sluice.types import GenerationRequest, SamplingParams

# sluice's kernels run on the GGUF's quantized blocks, transformers on their fp32 dequantized
# values: the same function, summed in another order
TOL = 2e-3


@pytest.fixture(scope="module")
def engine(bundled) -> LLMEngine:
    # chunks of 7 tokens: prompt logprobs are gathered across several prefill steps
    return LLMEngine(bundled, EngineConfig(kv_cache_gib=0.05, block_size=16, long_prefill_threshold=7))


@pytest.fixture(scope="module")
def prompt(bundled) -> list[int]:
    return bundled.tokenizer.encode("The quick brown fox jumps over the lazy dog. " * 3 + "Then the dog")


def _reference(hf_bundled, ids: list[int]) -> torch.Tensor:
    """[len(ids), vocab]: log-probabilities of the token after each position."""
    with torch.no_grad():
        logits = hf_bundled(torch.tensor([ids])).logits[0].float()
    return torch.log_softmax(logits, dim=-1)


def _run(engine: LLMEngine, request_id: str, prompt: list[int], **sampling):
    return engine.generate([GenerationRequest(request_id, prompt, SamplingParams(**sampling))])[request_id]


def _events(engine: LLMEngine, req: GenerationRequest):
    engine.add_request(req)
    out = []
    while engine.has_unfinished():
        out += [e for e in engine.step() if e.request_id == req.request_id]
    return out


def test_prompt_and_output_logprobs_equal_transformers(engine, prompt, hf_bundled):
    events = _events(
        engine,
        GenerationRequest(
            "a", prompt, SamplingParams(max_tokens=5, temperature=0.0, logprobs=3, prompt_logprobs=2, ignore_eos=True)
        ),
    )
    output = [t for e in events for t in e.token_ids]
    scored = [lp for e in events for lp in e.logprobs]
    assert [lp.token_id for lp in scored] == output
    assert events[0].prompt_logprobs is not None and all(e.prompt_logprobs is None for e in events[1:])
    prompt_lps = events[0].prompt_logprobs
    assert len(prompt_lps) == len(prompt) and prompt_lps[0] is None
    ref = _reference(hf_bundled, prompt + output)
    for i, lp in enumerate(prompt_lps[1:], start=1):
        assert lp.token_id == prompt[i]
        assert lp.logprob == pytest.approx(float(ref[i - 1, prompt[i]]), abs=TOL)
        assert len(lp.top) == 2
        assert [t for t, _ in lp.top] == ref[i - 1].topk(2).indices.tolist() or abs(lp.top[0][1] - lp.top[1][1]) < TOL
    for j, lp in enumerate(scored):
        pos = len(prompt) + j - 1
        assert lp.logprob == pytest.approx(float(ref[pos, output[j]]), abs=TOL)
        assert len(lp.top) == 3
        assert lp.top[0][0] == output[j]  # greedy: the chosen token is the most likely
        assert lp.top[0][1] == lp.logprob
        values = [v for _, v in lp.top]
        assert values == sorted(values, reverse=True)


def test_logprobs_are_the_models_not_the_samplers(engine, prompt, hf_bundled):
    """At temperature 0.3 with top-k 5 the draw uses a sharpened, truncated distribution; the
    reported logprob is still the model's own."""
    out = _run(engine, "b", prompt, max_tokens=4, temperature=0.3, top_k=5, seed=7, logprobs=0, ignore_eos=True)
    ref = _reference(hf_bundled, prompt + out.token_ids)
    assert len(out.logprobs) == len(out.token_ids) == 4
    for j, lp in enumerate(out.logprobs):
        assert lp.top == ()
        assert lp.logprob == pytest.approx(float(ref[len(prompt) + j - 1, out.token_ids[j]]), abs=TOL)


def test_prompt_logprobs_are_never_served_from_the_prefix_cache(engine, prompt):
    first = _run(engine, "c1", prompt, max_tokens=1, temperature=0.0, prompt_logprobs=0)
    again = _run(engine, "c2", prompt, max_tokens=1, temperature=0.0, prompt_logprobs=0)
    plain = _run(engine, "c3", prompt, max_tokens=1, temperature=0.0)
    assert again.usage.cached_tokens == 0
    assert plain.usage.cached_tokens > 0  # the blocks are cached: only the asking request skips them
    assert plain.logprobs == [] and plain.prompt_logprobs is None
    assert [lp.logprob if lp else None for lp in first.prompt_logprobs] == [
        lp.logprob if lp else None for lp in again.prompt_logprobs
    ]


def test_logprobs_are_from_before_the_grammar_mask(engine, bundled, hf_bundled):
    """A JSON grammar forces tokens the model finds unlikely; their logprobs stay the model's."""
    from sluice.types import GuidedDecoding, GuidedKind

    prompt = bundled.tokenizer.encode("Write a haiku about the sea.")
    out = _run(
        engine, "g", prompt, max_tokens=4, temperature=0.0, logprobs=1, guided=GuidedDecoding(GuidedKind.JSON_OBJECT)
    )
    ref = _reference(hf_bundled, prompt + out.token_ids)
    assert out.text.startswith("{")
    for j, lp in enumerate(out.logprobs):
        assert lp.logprob == pytest.approx(float(ref[len(prompt) + j - 1, out.token_ids[j]]), abs=TOL)
