"""Speculative decoding in the engine, on the bundled model and both compute paths: the output is
token for token what plain decoding gives (greedy and seeded), inside a batch, with stop
sequences, stop tokens, max_tokens, a grammar, preemption and the prefix cache."""

from __future__ import annotations

import pytest

from sluice.engine.config import EngineConfig
from sluice.engine.engine import LLMEngine
from sluice.models.tools.guidance import json_schema_guidance
from sluice.types import GenerationEvent, GenerationRequest, SamplingParams

QUOTE = (
    "The quick brown fox jumps over the lazy dog. Sphinx of black quartz, judge my vow. "
    "Pack my box with five dozen liquor jugs."
)
REPETITIVE = [
    "Repeat this text exactly, word for word: " + QUOTE,
    'Return this JSON object unchanged: {"name": "Ada Lovelace", "born": 1815, "field": "mathematics", '
    '"known_for": ["the first program", "notes on the Analytical Engine"]}',
    "Rename the variable x to total in this code and show the whole code:\n"
    "def add(items):\n    x = 0\n    for item in items:\n        x = x + item\n    return x\n",
]
FREE = "Write a short poem about the sea."
SPEC = 4
GREEDY = SamplingParams(max_tokens=24, temperature=0.0)

pytestmark = pytest.mark.slow


def _chat(loaded, text: str) -> list[int]:
    return loaded.tokenizer.encode_chat([{"role": "user", "content": text}])


def _engine(loaded, spec: int, **kw) -> LLMEngine:
    return LLMEngine(loaded, EngineConfig(num_kv_blocks=kw.pop("num_kv_blocks", 512), speculative_tokens=spec, **kw))


def _outcome(ev: GenerationEvent) -> tuple:
    return ev.token_ids, ev.text, ev.finish_reason, ev.stop_sequence, ev.usage


def _both(loaded, reqs: list[GenerationRequest], **kw) -> tuple[dict, dict, LLMEngine, LLMEngine]:
    plain_engine, spec_engine = _engine(loaded, 0, **kw), _engine(loaded, SPEC, **kw)
    plain, spec = plain_engine.generate(reqs), spec_engine.generate(reqs)
    return (
        {k: _outcome(v) for k, v in plain.items()},
        {k: _outcome(v) for k, v in spec.items()},
        plain_engine,
        spec_engine,
    )


@pytest.fixture(scope="module")
def loaded(bundled_on_path):  # every test below runs once per path (see conftest.PATHS)
    return bundled_on_path


def test_same_tokens_greedy_seeded_stops_and_max_tokens_in_one_batch(loaded):
    seeded = SamplingParams(max_tokens=24, temperature=0.7, top_p=0.95, seed=11)
    quote = _chat(loaded, REPETITIVE[0])
    reqs = [GenerationRequest(f"g{i}", _chat(loaded, t), GREEDY) for i, t in enumerate([*REPETITIVE, FREE])]
    reqs += [GenerationRequest("s0", quote, seeded)]
    reqs += [GenerationRequest(f"m{n}", quote, SamplingParams(max_tokens=n, temperature=0)) for n in (1, 5)]
    plain, spec, plain_engine, spec_engine = _both(loaded, reqs)
    assert spec == plain
    stats = spec_engine.stats()
    assert stats.spec_accepted_tokens > 10, "the repetitive prompts should have accepted proposals"
    assert stats.output_tokens == sum(len(v[0]) for v in spec.values())
    assert [len(spec[f"m{n}"][0]) for n in (1, 5)] == [1, 5]

    # a stop string and a stop token met mid-reply end it exactly where plain decoding does
    tokens, text = plain["g0"][0], plain["g0"][1]
    words = text.split()
    stop_text, stop_token = words[len(words) // 2], tokens[len(tokens) // 2]
    stops = [
        GenerationRequest("stop", quote, SamplingParams(max_tokens=24, temperature=0, stop=(stop_text,))),
        GenerationRequest("tok", quote, SamplingParams(max_tokens=24, temperature=0, stop_token_ids=(stop_token,))),
    ]
    plain = {k: _outcome(v) for k, v in plain_engine.generate(stops).items()}
    spec = {k: _outcome(v) for k, v in spec_engine.generate(stops).items()}
    assert spec == plain and spec["stop"][3] == stop_text and len(spec["tok"][0]) <= len(tokens) // 2 + 1


def test_grammar_requests_are_exact_and_never_speculate(loaded):
    schema = json_schema_guidance(
        {
            "type": "object",
            "properties": {"name": {"type": "string", "maxLength": 20}, "born": {"type": "integer"}},
            "required": ["name", "born"],
        }
    )
    guided = SamplingParams(max_tokens=16, temperature=0, guided=schema)
    reqs = [GenerationRequest("json", _chat(loaded, REPETITIVE[1]), guided)]
    plain, spec, _, spec_engine = _both(loaded, reqs)
    assert spec == plain and spec_engine.stats().spec_proposed_tokens == 0


def test_preemption_and_the_prefix_cache_keep_the_tokens(loaded):
    greedy = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)
    reqs = [GenerationRequest(f"p{i}", _chat(loaded, t), greedy) for i, t in enumerate(REPETITIVE)]
    # a pool too small for all three to finish together: the newest are preempted and recomputed
    plain, spec, plain_engine, spec_engine = _both(loaded, reqs, num_kv_blocks=32, block_size=4)
    assert spec == plain and spec_engine.stats().num_preemptions > 0
    assert spec_engine.stats().spec_accepted_tokens > 0
    # a follow-up turn (the prompt + the reply) finds the reply's blocks cached, speculated or not
    followups = [
        GenerationRequest(
            f"f{i}",
            [*r.prompt_token_ids, *plain[f"p{i}"][0], *r.prompt_token_ids[-3:]],
            SamplingParams(max_tokens=1, temperature=0),
        )
        for i, r in enumerate(reqs)
    ]
    hits = []
    for engine in (plain_engine, spec_engine):
        engine.generate([reqs[0]])  # alone: nothing preempted, every block of the reply cached
        hits.append(engine.generate(followups[:1])["f0"].usage.cached_tokens)
    assert hits[1] == hits[0] >= len(reqs[0].prompt_token_ids) + 16
