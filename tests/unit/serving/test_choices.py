"""n choices: their own seeds and ids, and the prompt's KV blocks shared in the engine."""

from __future__ import annotations

from sluice.engine.config import EngineConfig
from sluice.engine.engine import LLMEngine
from sluice.serving.choices import choice_seed
from sluice.types import INT64_MAX, GenerationRequest, SamplingParams


def test_choice_seeds():
    assert choice_seed(None, 3) is None and choice_seed(42, 0) == 42
    seeds = [choice_seed(42, i) for i in range(16)]
    assert len(set(seeds)) == 16 and all(0 <= s <= INT64_MAX for s in seeds)
    assert seeds == [choice_seed(42, i) for i in range(16)]  # reproducible
    assert choice_seed(-(2**63), 5) is not None


def test_choices_submitted_together_share_the_prompts_blocks(tiny_llama):
    """What serving/choices.py relies on: choices of one prompt reaching the engine together
    compute the prompt once; the others start from its cached blocks."""
    engine = LLMEngine(tiny_llama, EngineConfig(block_size=4, num_kv_blocks=64))
    prompt = list(range(10, 31))  # 21 tokens: 5 full blocks
    reqs = [
        GenerationRequest(f"c-{i}", prompt, SamplingParams(max_tokens=3, temperature=1.0, seed=i)) for i in range(4)
    ]
    out = engine.generate(reqs)
    assert out["c-0"].usage.cached_tokens == 0
    assert [out[f"c-{i}"].usage.cached_tokens for i in range(1, 4)] == [20, 20, 20]
