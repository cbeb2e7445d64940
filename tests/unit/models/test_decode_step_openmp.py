"""A greedy decode step on the CPU kernels enters no OpenMP region.

Decode calls split over the kernels' helper pool (csrc/helper_pool.h). An OpenMP region inside
the step leaves torch's OpenMP thread spinning on the core the helper needs for milliseconds:
the fused forward's gather of the sampled rows did, through `h[logits_indices]` (aten::index
runs a region even at 8 rows), and the 32-row LM head after it took 16.6 instead of 12.2 ms
(docs/BENCHMARKS.md, "No OpenMP spinning against the helper pool"). It gathers with
index_select now; a profile of the step shows which torch ops ran.
"""

from __future__ import annotations

from torch.profiler import ProfilerActivity, profile

from sluice.engine.config import EngineConfig
from sluice.engine.engine import LLMEngine
from sluice.types import GenerationRequest, SamplingParams


def test_a_greedy_decode_step_makes_no_indexing_call(bundled):
    assert bundled.model.ops is not None, "the bundled model should run on the CPU kernels"
    engine = LLMEngine(bundled, EngineConfig(speculative_tokens=0))
    rows = 8
    for i in range(rows):
        prompt = [1 + (17 * i + 5 * j) % 4000 for j in range(12 + i)]
        engine.add_request(
            GenerationRequest(f"r{i}", prompt, SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True))
        )
    engine.step()  # every prompt prefills in the first step (12-19 tokens each)
    stats = engine.stats()
    assert stats.last_step_seqs == rows and stats.last_step_tokens > rows
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        engine.step()
    stats = engine.stats()
    assert stats.last_step_seqs == stats.last_step_tokens == rows, "the profiled step should be all decodes"
    ops = {event.key for event in prof.key_averages()}
    assert "aten::index" not in ops, f"a decode step indexes a tensor with a tensor (an OpenMP region): {sorted(ops)}"
    while engine.has_unfinished():
        engine.step()
