"""CUDA graphs for decode steps, the parts a CPU can check: the bucket a step pads to, the padded
static-buffer layout, and a whole engine run through the graph path with an eager stand-in for
the capture (same padding, buffers and in-graph attention layout), whose greedy output still
equals transformers'. The capture itself runs in tests/unit/models/test_gpu.py on a CUDA device."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from sluice.engine.config import EngineConfig
from sluice.engine.decode_graphs import (
    DecodeGraphs,
    EagerReplay,
    batch_bucket,
    batch_buckets,
    block_bucket,
    pad_decodes,
)
from sluice.engine.engine import LLMEngine
from sluice.engine.scheduler import ScheduledChunk
from sluice.models.random_init import hf_model, load_random_model, random_state_dict
from sluice.types import GenerationRequest, SamplingParams
from tests.reference import compare, hf_greedy


def test_batch_buckets_are_powers_of_two_up_to_max_num_seqs():
    assert batch_buckets(1) == [1]
    assert batch_buckets(64) == [1, 2, 4, 8, 16, 32, 64]
    assert batch_buckets(100) == [1, 2, 4, 8, 16, 32, 64, 128]
    assert [batch_bucket(n, 64) for n in (1, 2, 3, 5, 32, 33, 64)] == [1, 2, 4, 8, 32, 64, 64]
    assert batch_bucket(65, 64) is None and batch_bucket(0, 64) is None
    assert batch_bucket(100, 100) == 128


def test_block_buckets_double_from_the_minimum_and_stop_at_the_context_window():
    assert [block_bucket(n, 1024) for n in (1, 16, 17, 33, 1000, 1024)] == [16, 16, 32, 64, 1024, 1024]
    assert block_bucket(1025, 1024) is None
    assert block_bucket(90, 100) == 100  # the last bucket is the window itself, not past it
    assert block_bucket(3, 100, minimum=4) == 4


def _chunk(tokens: list[int], start: int, blocks: list[int]) -> ScheduledChunk:
    request = SimpleNamespace(all_token_ids=tokens, num_tokens=len(tokens))
    return ScheduledChunk(request, start, 1, blocks)  # type: ignore[arg-type]


def test_padded_rows_read_token_0_write_the_null_block_and_attend_one_slot():
    bs = 4
    a = _chunk(list(range(10, 20)), 9, [3, 5, 7])  # position 9: block 5's... slot 7*4+1
    b = _chunk(list(range(30, 35)), 4, [2, 6])  # position 4: slot 6*4+0
    step = pad_decodes([a, b], bs, batch=4, blocks=4)
    assert step.num_decodes == 2 and step.longs.dtype == torch.int64 and step.ints.dtype == torch.int32
    ids, positions, slots = step.longs.view(3, 4).tolist()
    assert ids == [19, 34, 0, 0]
    assert positions == [9, 4, 0, 0]
    assert slots == [7 * bs + 1, 6 * bs + 0, 0, 0]
    tables = step.ints[:16].view(4, 4).tolist()
    assert tables == [[3, 5, 7, 0], [2, 6, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0]]
    assert step.ints[16:].tolist() == [10, 5, 1, 1]


def test_only_decode_only_steps_that_fit_a_bucket_take_a_graph():
    loaded = load_random_model("tiny", seed=1)
    graphs = DecodeGraphs(loaded.model, [], block_size=4, max_batch=8, max_blocks=32, capture=EagerReplay)
    decode = _chunk([1, 2, 3], 2, [1])
    assert graphs.bucket([decode] * 3) == (4, 16)
    assert graphs.bucket([decode] * 9) is None  # past the largest batch bucket
    prefill = ScheduledChunk(SimpleNamespace(all_token_ids=[1, 2, 3], num_tokens=3), 0, 3, [1])
    assert graphs.bucket([decode, prefill]) is None
    long = _chunk(list(range(200)), 199, list(range(1, 51)))  # 50 blocks of 4 > 32
    assert graphs.bucket([long]) is None
    with pytest.raises(ValueError, match="CUDA graphs need a CUDA device"):
        DecodeGraphs(loaded.model, [], 4, 8, 32)


def test_cuda_graphs_setting_is_ignored_on_the_cpu():
    engine = LLMEngine(load_random_model("tiny"), EngineConfig(num_kv_blocks=64, cuda_graphs=True))
    assert engine.runner.graphs is None


def test_an_engine_run_through_the_graph_path_matches_transformers():
    """Mixed prompt lengths (so decode batches shrink through 5, 4, 3 ... and contexts cross
    block buckets), chunked prefill interleaved: every decode-only step replays a bucket."""
    state = random_state_dict("tiny", seed=5)
    loaded = load_random_model("tiny", state=state)
    hf = hf_model("tiny", state)
    engine = LLMEngine(loaded, EngineConfig(block_size=4, max_num_batched_tokens=32, num_kv_blocks=512, max_num_seqs=8))
    graphs = engine.runner.graphs = DecodeGraphs(
        loaded.model, engine.runner.kv_caches, 4, 8, -(-engine.max_model_len // 4), capture=EagerReplay
    )
    prompts = [[3 + (7 * i + j * 13) % 500 for j in range(n)] for i, n in enumerate([5, 17, 40, 63, 90])]
    lengths = [40, 20, 30, 8, 24]
    reqs = [
        GenerationRequest(f"r{i}", p, SamplingParams(max_tokens=m, temperature=0.0))
        for i, (p, m) in enumerate(zip(prompts, lengths))
    ]
    results = engine.generate(reqs)
    assert graphs.replays > 30
    assert len({b for b, _ in graphs.graphs}) >= 3 and {w for _, w in graphs.graphs} >= {16, 32}
    for i, (p, m) in enumerate(zip(prompts, lengths)):
        compare(hf_greedy(hf, p, m, eos=0), results[f"r{i}"].token_ids, f"graph path prompt {i}")


def test_a_failed_capture_turns_graphs_off_and_every_step_runs_eagerly():
    loaded = load_random_model("tiny", seed=2)
    config = EngineConfig(block_size=4, num_kv_blocks=256, max_num_seqs=4)

    def refuse(fn):
        raise RuntimeError("capture refused")

    def greedy(engine: LLMEngine) -> list[list[int]]:
        reqs = [
            GenerationRequest(f"r{i}", [5 + i, 9, 11 + 2 * i], SamplingParams(max_tokens=6, temperature=0.0))
            for i in range(3)
        ]
        results = engine.generate(reqs)
        return [results[r.request_id].token_ids for r in reqs]

    engine = LLMEngine(loaded, config)
    graphs = engine.runner.graphs = DecodeGraphs(loaded.model, engine.runner.kv_caches, 4, 4, 64, capture=refuse)
    assert greedy(engine) == greedy(LLMEngine(loaded, config))
    assert graphs.failure is not None and "capture refused" in graphs.failure and graphs.replays == 0
