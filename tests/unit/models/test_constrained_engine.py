"""Constrained decoding in the engine, with the bundled model: structured outputs, forced tool
calls, streaming pieces, neighbours left unchanged, preemption, refusal before queueing."""

from __future__ import annotations

import json

import jsonschema
import pytest

from sluice.engine.config import EngineConfig
from sluice.engine.engine import LLMEngine
from sluice.errors import InvalidRequestError
from sluice.models.tools.format import HERMES
from sluice.models.tools.guidance import json_schema_guidance, tool_guidance
from sluice.models.tools.parser import ToolArgsDelta, ToolCallEnd, ToolCallParser
from sluice.models.tools.render import render_turns
from sluice.tool_types import ChatTurn, Role, ToolCall, ToolChoice, ToolChoiceMode, ToolResult, ToolSpec
from sluice.types import FinishReason, GenerationRequest, SamplingParams
from tests.schema_gen import random_schema

pytestmark = pytest.mark.slow

WEATHER = ToolSpec(
    "get_weather",
    {
        "type": "object",
        "properties": {
            "location": {"type": "string", "maxLength": 40},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
        },
        "required": ["location", "unit"],
        "additionalProperties": False,
    },
    "Get the current weather in a city",
    strict=True,
)
TIME = ToolSpec(
    "get_time",
    {"type": "object", "properties": {"timezone": {"type": "string", "maxLength": 40}}, "required": ["timezone"]},
    "Get the current time in a timezone (IANA name)",
)
TOOLS = [WEATHER, TIME]
# Needs at least 40 strings: it cannot complete in the few tokens the neighbour tests run.
ENDLESS = json_schema_guidance(
    {
        "type": "object",
        "properties": {
            "n": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9}, "minItems": 40}
        },
        "required": ["n"],
    }
)


@pytest.fixture(scope="module")
def engine(bundled):
    return LLMEngine(bundled, EngineConfig(num_kv_blocks=2048, max_num_seqs=64))


def _chat(bundled, text: str) -> list[int]:
    return bundled.tokenizer.encode_chat([{"role": "user", "content": text}])


def _tool_prompt(bundled, turns: list[ChatTurn]) -> list[int]:
    return bundled.tokenizer.encode(bundled.tokenizer.render_chat(render_turns(turns, TOOLS, HERMES)))


def _parse(text: str) -> ToolCallParser:
    parser = ToolCallParser(HERMES)
    parser.feed(text)
    parser.finish()
    return parser


def test_constrained_outputs_validate_for_50_generated_schemas(bundled, engine):
    schemas = [random_schema(seed) for seed in range(50)]
    reqs = []
    for i, schema in enumerate(schemas):
        jsonschema.Draft202012Validator.check_schema(schema)
        # greedy for half, seeded sampling for the other half: both paths go through the mask
        params = SamplingParams(
            max_tokens=200, temperature=0.0 if i % 2 == 0 else 0.8, seed=i, guided=json_schema_guidance(schema)
        )
        reqs.append(GenerationRequest(f"schema-{i}", _chat(bundled, "Give me an example record as JSON."), params))
    out = engine.generate(reqs)
    failures = []
    for i, schema in enumerate(schemas):
        ev = out[f"schema-{i}"]
        try:
            assert ev.finish_reason is FinishReason.EOS, ev.finish_reason
            jsonschema.validate(json.loads(ev.text), schema)
        except (AssertionError, ValueError, jsonschema.ValidationError) as exc:
            failures.append(f"schema {i}: {type(exc).__name__}: {str(exc)[:120]} in {ev.text[:200]!r}")
    assert not failures, "\n".join(failures)


def test_the_reply_ends_when_the_grammar_completes(bundled, engine):
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
    ev = engine.generate(
        [
            GenerationRequest(
                "done",
                _chat(bundled, "Is water wet? JSON."),
                SamplingParams(max_tokens=50, temperature=0.0, guided=json_schema_guidance(schema)),
            )
        ]
    )["done"]
    assert ev.finish_reason is FinishReason.EOS and json.loads(ev.text) in ({"ok": True}, {"ok": False})
    assert ev.token_ids[-1] not in engine.eos_ids  # ended on the closing brace, not one step later


@pytest.mark.parametrize(
    "choice",
    [
        ToolChoice(ToolChoiceMode.ANY, disable_parallel=True),
        ToolChoice(ToolChoiceMode.TOOL, "get_time", disable_parallel=True),
    ],
    ids=["any", "named"],
)
def test_forced_tool_call_validates_against_the_schema(bundled, engine, choice):
    prompt = _tool_prompt(
        bundled, [ChatTurn(Role.USER, ["What's the weather like in Paris, and what time is it there?"])]
    )
    ev = engine.generate(
        [
            GenerationRequest(
                f"forced-{choice.mode.value}",
                prompt,
                SamplingParams(max_tokens=80, temperature=0.0, guided=tool_guidance(TOOLS, choice, HERMES)),
            )
        ]
    )[f"forced-{choice.mode.value}"]
    assert ev.finish_reason is FinishReason.EOS, ev.text
    calls = _parse(ev.text).calls
    assert len(calls) == 1
    if choice.name:
        assert calls[0].name == choice.name
    tool = next(t for t in TOOLS if t.name == calls[0].name)
    jsonschema.validate(calls[0].input, tool.input_schema)
    assert calls[0].id.startswith("toolu_")


def test_streamed_argument_deltas_concatenate_to_the_final_input(bundled, engine):
    prompt = _tool_prompt(bundled, [ChatTurn(Role.USER, ["Weather in Lisbon, in celsius?"])])
    req = GenerationRequest(
        "stream",
        prompt,
        SamplingParams(
            max_tokens=80,
            temperature=0.0,
            guided=tool_guidance(TOOLS, ToolChoice(ToolChoiceMode.ANY, disable_parallel=True), HERMES),
        ),
    )
    engine.add_request(req)
    parser, pieces, text = ToolCallParser(HERMES), [], ""
    while engine.has_unfinished():
        for ev in engine.step():
            text += ev.text
            pieces += parser.feed(ev.text)
    pieces += parser.finish()
    deltas = [p.json for p in pieces if isinstance(p, ToolArgsDelta)]
    end = next(p for p in pieces if isinstance(p, ToolCallEnd))
    assert len(deltas) > 1  # it really streamed
    assert "".join(deltas) == end.arguments and json.loads(end.arguments) == end.input
    assert end.input == _parse(text).calls[0].input  # same as parsing the whole reply at once
    jsonschema.validate(end.input, WEATHER.input_schema)


def test_after_a_tool_result_tool_choice_none_answers_in_text(bundled, engine):
    turns = [
        ChatTurn(Role.USER, ["What's the weather in Paris?"]),
        ChatTurn(Role.ASSISTANT, [ToolCall("toolu_1", "get_weather", {"location": "Paris", "unit": "celsius"})]),
        ChatTurn(Role.USER, [ToolResult("toolu_1", "Sunny, 21 degrees celsius")]),
    ]
    guided = tool_guidance(TOOLS, ToolChoice(ToolChoiceMode.NONE), HERMES)
    ev = engine.generate(
        [
            GenerationRequest(
                "answer", _tool_prompt(bundled, turns), SamplingParams(max_tokens=40, temperature=0.0, guided=guided)
            )
        ]
    )["answer"]
    assert ev.text.strip() and HERMES.trigger not in ev.text and not _parse(ev.text).calls


def test_unconstrained_rows_are_unchanged_by_constrained_neighbours(bundled, engine):
    """Same batch shape both times (every row runs exactly 16 tokens); only the neighbours'
    grammar differs. The unconstrained row must come out token for token the same."""
    target = _chat(bundled, "Describe how rain forms in a few sentences.")
    others = [_chat(bundled, f"List {n} facts about owls.") for n in (3, 4, 5)]

    def run(tag: str, guided) -> tuple[list[int], list[str]]:
        fixed = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)
        reqs = [GenerationRequest(f"{tag}-target", target, fixed)]
        reqs += [
            GenerationRequest(
                f"{tag}-{i}", p, SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True, guided=guided)
            )
            for i, p in enumerate(others)
        ]
        out = engine.generate(reqs)
        assert all(len(e.token_ids) == 16 for e in out.values())
        return out[f"{tag}-target"].token_ids, [out[f"{tag}-{i}"].text for i in range(len(others))]

    plain_target, plain_others = run("plain", None)
    masked_target, masked_others = run("masked", ENDLESS)
    assert masked_target == plain_target
    assert all(t.startswith('{"n": [') for t in masked_others) and masked_others != plain_others  # the mask acted


def test_preempted_constrained_requests_rebuild_their_grammar_and_still_validate(bundled):
    # 3 requests of ~110 tokens each (prompt + 16 words) need ~42 blocks of 8; the pool has 23
    small = LLMEngine(bundled, EngineConfig(num_kv_blocks=24, max_num_seqs=8))
    matchers = []
    make = small.grammars.matcher
    small.grammars.matcher = lambda spec: matchers.append(make(spec)) or matchers[-1]
    schema = {
        "type": "object",
        "properties": {
            "words": {
                "type": "array",
                "items": {"type": "string", "minLength": 3, "maxLength": 10},
                "minItems": 16,
                "maxItems": 16,
            }
        },
        "required": ["words"],
    }
    reqs = [
        GenerationRequest(
            f"p{i}",
            _chat(bundled, f"Name sixteen {topic}, as JSON."),
            SamplingParams(max_tokens=150, temperature=0.0, guided=json_schema_guidance(schema)),
        )
        for i, topic in enumerate(["fruits", "rivers", "birds"])
    ]
    out = small.generate(reqs)
    assert small.stats().num_preemptions > 0
    assert any(m.rebuilds > 0 for m in matchers)  # rebuilt from its tokens after a preemption
    for ev in out.values():
        assert ev.finish_reason is FinishReason.EOS, ev.text
        jsonschema.validate(json.loads(ev.text), schema)


def test_unsupported_schema_is_refused_before_queueing_naming_the_keyword(bundled, engine):
    schema = {
        "type": "object",
        "properties": {"tags": {"type": "array", "items": {"type": "string"}, "uniqueItems": True}},
    }
    req = GenerationRequest("bad", _chat(bundled, "hi"), SamplingParams(guided=json_schema_guidance(schema)))
    with pytest.raises(
        InvalidRequestError, match=r"schema\.properties\.tags\.uniqueItems: the JSON schema keyword 'uniqueItems'"
    ):
        engine.add_request(req)
    assert "bad" not in engine.requests and not engine.has_unfinished()
    with pytest.raises(InvalidRequestError, match="objekt"):
        engine.add_request(
            GenerationRequest(
                "bad2", _chat(bundled, "hi"), SamplingParams(guided=json_schema_guidance({"type": "objekt"}))
            )
        )


def test_async_front_streams_a_constrained_reply_and_refuses_a_bad_one(bundled):
    import asyncio

    from sluice.engine.async_engine import AsyncEngine

    front = AsyncEngine(LLMEngine(bundled, EngineConfig(num_kv_blocks=256))).start()
    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}}, "required": ["city"]}

    async def main() -> list:
        req = GenerationRequest(
            "a1",
            _chat(bundled, "Capital of France, as JSON."),
            SamplingParams(max_tokens=40, temperature=0.0, guided=json_schema_guidance(schema)),
        )
        events = [ev async for ev in front.generate(req)]
        bad = GenerationRequest(
            "a2", _chat(bundled, "hi"), SamplingParams(guided=json_schema_guidance({"type": "object", "not": {}}))
        )
        with pytest.raises(InvalidRequestError, match="'not'"):
            async for _ in front.generate(bad):
                pass
        return events

    try:
        events = asyncio.run(main())
    finally:
        front.shutdown()
    assert events[-1].finish_reason is FinishReason.EOS
    jsonschema.validate(json.loads("".join(e.text for e in events)), schema)


def test_a_resumed_constrained_generation_continues_its_grammar(bundled, engine):
    """Mid-stream failover: another worker's first tokens come back as resumed_output_ids; the
    grammar state is rebuilt from them and the reply ends exactly as the uninterrupted one."""
    schema = {
        "type": "object",
        "properties": {
            "fruits": {"type": "array", "items": {"type": "string", "maxLength": 12}, "minItems": 3, "maxItems": 3}
        },
        "required": ["fruits"],
    }
    prompt = _chat(bundled, "Three fruits, as JSON.")
    params = SamplingParams(max_tokens=60, temperature=0.0, guided=json_schema_guidance(schema))
    whole = engine.generate([GenerationRequest("whole", prompt, params)])["whole"]
    assert whole.finish_reason is FinishReason.EOS and len(whole.token_ids) > 8
    head = whole.token_ids[:6]
    head_text = bundled.tokenizer.decode(head)
    resumed = engine.generate(
        [GenerationRequest("resumed", prompt, params, resumed_output_ids=head, resumed_text_chars=len(head_text))]
    )["resumed"]
    assert head + resumed.token_ids == whole.token_ids
    assert head_text + resumed.text == whole.text
    jsonschema.validate(json.loads(whole.text), schema)
    with pytest.raises(InvalidRequestError, match="does not follow the request's grammar"):
        engine.add_request(
            GenerationRequest("off", prompt, params, resumed_output_ids=bundled.tokenizer.encode("Hello"))
        )
