"""The same request gives the same tokens alone, in a batch of 32, after a preemption, and on a
prefix-cache hit (greedy, and seeded sampling), on both the CPU kernels and the torch path."""

from __future__ import annotations

import pytest
import torch

from sluice.engine.config import EngineConfig
from sluice.engine.engine import LLMEngine
from sluice.types import GenerationRequest, SamplingParams
from tests.reference import TIE_TOL

TARGET = "Describe how rain forms, from evaporation to the drops that fall, in a few sentences."
OTHERS = [
    f"Give me {n} ideas for a {topic} and explain the best one briefly."
    for n in (2, 3, 4, 5)
    for topic in (
        "birthday party",
        "garden",
        "weekend trip",
        "science fair project",
        "short story",
        "team lunch",
        "podcast",
        "mobile app",
    )
][:31]

GREEDY = SamplingParams(max_tokens=40, temperature=0.0)
SEEDED = SamplingParams(max_tokens=40, temperature=0.8, top_p=0.95, top_k=50, seed=1234)


def _prompt(loaded, text: str, system: str | None = None) -> list[int]:
    msgs = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": text}]
    return loaded.tokenizer.encode_chat(msgs)


def _assert_same(hf_bundled, prompt: list[int], expected: list[int], got: list[int], label: str) -> None:
    """Equal, or diverging only where the two best next-token logits tie (see tests/reference.py)."""
    if got == expected:
        return
    i = next((i for i, (a, b) in enumerate(zip(expected, got)) if a != b), min(len(expected), len(got)))
    assert i < min(len(expected), len(got)), f"{label}: one output is a prefix of the other"
    with torch.no_grad():
        logits = hf_bundled(torch.tensor([prompt + expected[:i]])).logits[0, -1]
    top = torch.topk(logits, 2)
    gap = float(top.values[0] - top.values[1])
    assert gap < TIE_TOL and {expected[i], got[i]} <= set(top.indices.tolist()), (
        f"{label}: token {i} differs ({expected[i]} vs {got[i]}), top-2 logit gap {gap:.3g}"
    )
    print(f"{label}: accepted a tie at token {i} (gap {gap:.2g})")


def _run(engine: LLMEngine, reqs: list[GenerationRequest]) -> dict[str, list[int]]:
    return {k: v.token_ids for k, v in engine.generate(reqs).items()}


@pytest.fixture(scope="module")
def loaded(bundled_on_path):  # every test below runs once per path (see conftest.PATHS)
    return bundled_on_path


@pytest.fixture(scope="module")
def alone(loaded):
    engine = LLMEngine(loaded, EngineConfig(num_kv_blocks=64))
    prompt = _prompt(loaded, TARGET)
    out = _run(engine, [GenerationRequest("g", prompt, GREEDY), GenerationRequest("s", prompt, SEEDED)])
    return prompt, out["g"], out["s"]


@pytest.mark.slow
def test_same_tokens_in_a_batch_of_32(loaded, hf_bundled, alone):
    prompt, greedy, seeded = alone
    engine = LLMEngine(loaded, EngineConfig(num_kv_blocks=1024, max_num_batched_tokens=512))
    reqs = [GenerationRequest(f"o{i}", _prompt(loaded, t), GREEDY) for i, t in enumerate(OTHERS[:30])]
    reqs.insert(15, GenerationRequest("g", prompt, GREEDY))
    reqs.insert(3, GenerationRequest("s", prompt, SEEDED))
    assert len(reqs) == 32
    out = _run(engine, reqs)
    _assert_same(hf_bundled, prompt, greedy, out["g"], "batch of 32 (greedy)")
    assert out["s"] == seeded, "seeded sampling changed in a batch"


@pytest.mark.slow
def test_same_tokens_after_preemption(loaded, hf_bundled, alone):
    prompt, greedy, seeded = alone
    # 4 long-running requests in a pool that cannot hold them all: the newest get preempted
    # and recomputed, repeatedly.
    engine = LLMEngine(loaded, EngineConfig(num_kv_blocks=15, block_size=16, watermark=0.0))
    reqs = [GenerationRequest("early", _prompt(loaded, OTHERS[0]), GREEDY)]
    reqs += [GenerationRequest("g", prompt, GREEDY), GenerationRequest("s", prompt, SEEDED)]
    out = _run(engine, reqs)
    assert engine.stats().num_preemptions > 0
    _assert_same(hf_bundled, prompt, greedy, out["g"], "after preemption (greedy)")
    assert out["s"] == seeded, "seeded sampling changed after preemption"


@pytest.mark.slow
def test_same_tokens_on_a_prefix_cache_hit(loaded, hf_bundled, alone):
    prompt, greedy, seeded = alone
    engine = LLMEngine(loaded, EngineConfig(num_kv_blocks=128))
    _run(engine, [GenerationRequest("warm", prompt, GREEDY)])
    out = engine.generate([GenerationRequest("g", prompt, GREEDY), GenerationRequest("s", prompt, SEEDED)])
    bs = engine.config.block_size
    full_blocks = (len(prompt) - 1) // bs * bs  # never the last prompt token
    assert out["g"].usage.cached_tokens == out["s"].usage.cached_tokens == full_blocks > 0
    _assert_same(hf_bundled, prompt, greedy, out["g"].token_ids, "prefix-cache hit (greedy)")
    assert out["s"].token_ids == seeded, "seeded sampling changed on a prefix-cache hit"


@pytest.mark.slow
@pytest.mark.parametrize("split", [1, 7, 23])
def test_a_resumed_generation_continues_exactly(bundled, hf_bundled, alone, split):
    """Mid-stream failover continues a request on another engine from its prompt plus the output
    tokens already sent (`resumed_output_ids`): the continuation is the rest of the uninterrupted
    run, token for token (greedy and seeded), and its text picks up where the delivered text ended."""
    prompt, greedy, seeded = alone
    engine = LLMEngine(bundled, EngineConfig(num_kv_blocks=64))
    for label, params, full in (("greedy", GREEDY, greedy), ("seeded", SEEDED, seeded)):
        first = engine.generate(
            [
                GenerationRequest(
                    "a",
                    prompt,
                    SamplingParams(
                        **{
                            **{f: getattr(params, f) for f in ("temperature", "top_p", "top_k", "seed")},
                            "max_tokens": split,
                        }
                    ),
                )
            ]
        )["a"]
        assert first.token_ids == full[:split]
        rest = engine.generate(
            [
                GenerationRequest(
                    "b", prompt, params, resumed_output_ids=first.token_ids, resumed_text_chars=len(first.text)
                )
            ]
        )["b"]
        _assert_same(hf_bundled, prompt, full, first.token_ids + rest.token_ids, f"{label} resumed at {split}")
        whole = engine.generate([GenerationRequest("c", prompt, params)])["c"]
        if first.token_ids + rest.token_ids == whole.token_ids:
            assert first.text + rest.text == whole.text
        assert rest.usage.output_tokens == len(full)  # usage counts the whole reply


@pytest.mark.slow
def test_decode_split_over_two_threads_gives_the_same_tokens(loaded, path):
    """`decode_split_rows` (1 by default) splits decode calls' linears and attention over the
    kernels' helper pool: the same 32 requests give exactly the same tokens with it as without
    (0), and the engine sets the cut it asks for (and resets it when a later engine does not)."""
    from sluice.models.kernels import ATTN_SPLIT_MIN_WORK, DECODE_SPLIT_MIN_WORK, kernel_ops

    # the split cuts the kernels' calls of every decode batch; the torch path has no helper pool, so
    # there the setting must only leave the tokens alone, which a batch of 4 shows (32 took ~50 s)
    n = 32 if path == "kernels" else 4
    reqs = [GenerationRequest(f"o{i}", _prompt(loaded, t), GREEDY) for i, t in enumerate(OTHERS[: n - 1])]
    reqs.append(GenerationRequest("s", _prompt(loaded, TARGET), SEEDED))
    before = torch.get_num_threads()
    try:
        out = {}
        for rows in (0, 1):
            engine = LLMEngine(loaded, EngineConfig(num_kv_blocks=1024, threads=2, decode_split_rows=rows))
            ops = kernel_ops() if path == "kernels" else None
            if ops is not None:
                assert ops.split_cut() == [1 if rows else ops.DECODE_MAX_ROWS + 1, DECODE_SPLIT_MIN_WORK]
                # and decode attention at long context, at any batch size (off with the rest)
                assert ops.attn_split_work() == (ATTN_SPLIT_MIN_WORK if rows else (1 << 63) - 1)
            out[rows] = _run(engine, reqs)
        assert out[1] == out[0]
    finally:
        torch.set_num_threads(before)
        LLMEngine(loaded, EngineConfig(num_kv_blocks=16))  # back to the default cut for later tests
