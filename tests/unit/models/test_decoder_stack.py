"""The kernels' one-call decoder stack (csrc/decoder_stack.h) gives the per-layer loop's bits.

fused_forward runs every layer inside the extension when one paged_decode call attends every row
of a step (decodes, short prefill chunks), and keeps its Python loop otherwise (a prefill chunk
past PAGED_PREFILL_MAX_CONTEXT goes through SDPA). Both must compute the same function to the
bit: the same engine workload runs once with the stack and once without, and every step's
logits are compared with torch.equal.
"""

from __future__ import annotations

import pytest
import torch

from sluice.engine.config import EngineConfig
from sluice.engine.engine import LLMEngine
from sluice.models.kernels import Numerics
from sluice.models.kernels.paged_attention import PAGED_PREFILL_MAX_CONTEXT
from sluice.types import GenerationRequest, SamplingParams


class _CountingStack:
    """Delegates to the extension's DecoderStack and counts the steps it ran."""

    def __init__(self, stack):
        self.stack, self.calls = stack, 0

    def forward(self, *args, **kwargs):
        self.calls += 1
        return self.stack.forward(*args, **kwargs)


def _prompts() -> list[list[int]]:
    short = [[1 + (11 * i + 7 * j) % 4000 for j in range(n)] for i, n in enumerate([3, 19, 40, 77])]
    long = [5 + (13 * j) % 3000 for j in range(PAGED_PREFILL_MAX_CONTEXT + 40)]  # its chunk goes through SDPA
    return short + [long]


def _steps(loaded, stack, numerics: Numerics) -> list[torch.Tensor]:
    """Every forward's logits over one workload: short prompts decoding while others prefill."""
    model = loaded.model
    real_forward, real_stack, logits = model.forward, model.stack, []

    def record(*args, **kwargs):
        out = real_forward(*args, **kwargs)
        logits.append(out.clone())
        return out

    model.forward, model.stack = record, stack
    try:
        engine = LLMEngine(loaded, EngineConfig(max_num_batched_tokens=64, numerics=numerics, speculative_tokens=0))
        reqs = [
            GenerationRequest(f"r{i}", p, SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True))
            for i, p in enumerate(_prompts())
        ]
        engine.generate(reqs)
    finally:
        del model.forward  # the instance attribute; the class's method again
        model.stack = real_stack
    return logits


def test_the_stack_gives_the_per_layer_loops_bits_and_the_loop_keeps_long_prefills(bundled):
    model = bundled.model
    assert model.stack is not None, "the bundled model's Q4_1 / Q8_0 layers should run as one stack"
    assert model.stack.num_layers == model.config.num_layers
    for numerics in (Numerics.EXACT, Numerics.FAST):
        counting = _CountingStack(model.stack)
        with_stack = _steps(bundled, counting, numerics)
        without = _steps(bundled, None, numerics)
        assert len(with_stack) == len(without)
        # most steps ran the stack; the long prompt's SDPA chunks (64-token budget) ran the loop
        assert 0 < counting.calls < len(with_stack), (counting.calls, len(with_stack))
        for i, (a, b) in enumerate(zip(with_stack, without)):
            assert torch.equal(a, b), f"{numerics} step {i}: the stack's logits differ from the loop's"


def test_the_stack_refuses_caches_that_do_not_match_its_layers(bundled):
    model = bundled.model
    h = torch.zeros(1, model.config.hidden_size)
    ids = torch.zeros(1, dtype=torch.long)
    with pytest.raises(RuntimeError, match="caches for"):
        model.stack.forward(
            h, ids, ids, [], torch.zeros(1, 1, dtype=torch.int32), torch.ones(1, dtype=torch.int32), 16, False
        )
