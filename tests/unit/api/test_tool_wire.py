"""Tool use and structured outputs on the wire side, without a server: wire fields → serving's
terms, the prompt they render, the coalescing / idempotency keys, and the call parser stage."""

from __future__ import annotations

import asyncio
import json

import pytest

from sluice.api.anthropic.convert import parse_body, to_serving_request
from sluice.api.anthropic.schema import MessagesRequest
from sluice.api.errors import ApiError
from sluice.api.openai.convert import parse_body as openai_body
from sluice.api.openai.convert import to_conversation as openai_conversation
from sluice.api.openai.tools import response_format, tool_choice
from sluice.config import Settings
from sluice.gateway.coalescer import coalesce_key
from sluice.gateway.principal import Principal
from sluice.models.tools.format import HERMES
from sluice.serving.errors import ServingError
from sluice.serving.guided import OutputFormat, guided_for
from sluice.serving.idempotency.retries import fingerprint
from sluice.serving.outcomes import Finished, TextDelta, ToolCallDone, ToolCallStarted, ToolInputDelta
from sluice.serving.prompt import _chat
from sluice.serving.stages.tool_stream import with_tool_calls
from sluice.tool_types import ToolCall, ToolChoiceMode, ToolResult
from sluice.types import FinishReason, GuidedKind

WEATHER = {
    "name": "get_weather",
    "description": "Weather.",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
BASE = {"model": "m", "max_tokens": 16, "temperature": 0, "messages": [{"role": "user", "content": "Weather in Oslo?"}]}


def anthropic_request(body: dict, betas: list[str] | None = None):
    req = parse_body(json.dumps(body).encode(), MessagesRequest, lenient=False)
    return req, to_serving_request(req, Principal(), "msg_1", "2023-06-01", Settings())


def test_requests_differing_only_in_tools_neither_coalesce_nor_share_a_key():
    plain, s_plain = anthropic_request(BASE)
    tools, s_tools = anthropic_request({**BASE, "tools": [WEATHER]})
    other = {**WEATHER, "input_schema": {**WEATHER["input_schema"], "required": []}}
    tools2, s_tools2 = anthropic_request({**BASE, "tools": [other]})
    forced, s_forced = anthropic_request({**BASE, "tools": [WEATHER], "tool_choice": {"type": "any"}})
    schema, s_schema = anthropic_request(
        {**BASE, "output_config": {"format": {"type": "json_schema", "schema": {"type": "object"}}}}
    )
    keys = {coalesce_key("t", "v1", s.dedup_body) for s in (s_plain, s_tools, s_tools2, s_forced, s_schema)}
    assert None not in keys and len(keys) == 5
    prints = {fingerprint("/v1/messages", r.model_dump(mode="json")) for r in (plain, tools, tools2, forced, schema)}
    assert len(prints) == 5
    assert s_forced.tool_choice.mode is ToolChoiceMode.ANY and s_schema.output_format == OutputFormat(
        {"type": "object"}
    )
    oa = [
        openai_body(json.dumps({"model": "m", "temperature": 0, "messages": BASE["messages"], **extra}).encode(), False)
        for extra in (
            {},
            {"tools": [{"type": "function", "function": {"name": "f"}}]},
            {"response_format": {"type": "json_object"}},
        )
    ]
    assert len({coalesce_key("t", "v1", b.model_dump(exclude_none=True)) for b in oa}) == 3


def test_anthropic_history_becomes_calls_and_results_in_the_prompt():
    body = {
        **BASE,
        "tools": [WEATHER],
        "system": "Be brief.",
        "messages": [
            {"role": "user", "content": "Weather in Oslo?"},
            {
                "role": "assistant",
                "content": [
                    {"type": "text", "text": "Checking."},
                    {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Oslo"}},
                ],
            },
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": "toolu_1",
                        "is_error": True,
                        "content": [{"type": "text", "text": "timeout"}],
                    }
                ],
            },
        ],
    }
    _, sreq = anthropic_request(body)
    conv = sreq.conversation
    assert conv.turns[2].parts[1] == ToolCall("toolu_1", "get_weather", {"city": "Oslo"})
    assert conv.turns[3].parts == [ToolResult("toolu_1", "timeout", True)]
    chat = _chat(conv.turns, conv.tools, HERMES)
    assert (
        chat[0]["role"] == "system"
        and chat[0]["content"].startswith("Be brief.")
        and '"get_weather"' in chat[0]["content"]
    )
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>' in chat[2]["content"]
    assert chat[3]["content"] == "<tool_response>\nError: timeout\n</tool_response>"
    assert "timeout" in conv.safety_texts() and "Checking." not in conv.safety_texts()


@pytest.mark.parametrize(
    "body, words",
    [
        ({"tools": [{**WEATHER, "input_schema": {"type": "string"}}]}, "input_schema.type"),
        ({"tools": [{**WEATHER, "colour": "red"}]}, "tools.0.colour: Extra inputs are not permitted"),
        ({"tools": [WEATHER], "tool_choice": {"type": "auto", "name": "x"}}, "tool_choice.name"),
        ({"output_format": {"type": "json_schema", "schema": {}}}, "anthropic-beta"),
        (
            {
                "messages": [
                    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_9", "content": "x"}]}
                ]
            },
            "toolu_9",
        ),
    ],
)
def test_anthropic_bad_tool_fields(body, words):
    with pytest.raises((ServingError, ApiError)) as info:
        anthropic_request({**BASE, **body})
    assert words in str(info.value) or words in getattr(info.value, "message", "")


def test_openai_fields():
    assert tool_choice("required", False).mode is ToolChoiceMode.ANY and tool_choice("required", False).disable_parallel
    named = tool_choice({"type": "function", "function": {"name": "f"}}, None)
    assert named.mode is ToolChoiceMode.TOOL and named.name == "f"
    assert response_format(
        {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "array"}}}
    ) == OutputFormat({"type": "array"})
    assert response_format({"type": "json_object"}) == OutputFormat(None) and response_format({"type": "text"}) is None
    with pytest.raises(ApiError):
        tool_choice("sometimes", None)
    body = openai_body(
        json.dumps(
            {
                "model": "m",
                "messages": [
                    {"role": "user", "content": "Oslo and Rome?"},
                    {
                        "role": "assistant",
                        "content": None,
                        "tool_calls": [
                            {
                                "id": "call_1",
                                "type": "function",
                                "function": {"name": "w", "arguments": '{"city": "Oslo"}'},
                            },
                            {
                                "id": "call_2",
                                "type": "function",
                                "function": {"name": "w", "arguments": '{"city": "Rome"}'},
                            },
                        ],
                    },
                    {"role": "tool", "tool_call_id": "call_1", "content": "rain"},
                    {"role": "tool", "tool_call_id": "call_2", "content": "sun"},
                ],
                "tools": [{"type": "function", "function": {"name": "w"}}],
            }
        ).encode(),
        False,
    )
    conv = openai_conversation(body)
    assert conv.turns[1].parts == [ToolCall("call_1", "w", {"city": "Oslo"}), ToolCall("call_2", "w", {"city": "Rome"})]
    assert conv.turns[2].parts == [ToolResult("call_1", "rain"), ToolResult("call_2", "sun")]  # one turn of results
    assert conv.tools[0].input_schema == {"type": "object", "properties": {}}


def test_guidance_is_checked_before_queueing():
    _, sreq = anthropic_request({**BASE, "tools": [WEATHER], "tool_choice": {"type": "tool", "name": "get_weather"}})
    spec = guided_for(sreq.conversation, sreq.tool_choice, None, HERMES)
    assert spec is not None and spec.kind is GuidedKind.TOOL_CALLS and not spec.allow_text and spec.min_calls == 1
    with pytest.raises(ServingError, match="uniqueItems"):
        guided_for(sreq.conversation, sreq.tool_choice, OutputFormat({"type": "array", "uniqueItems": True}), HERMES)
    _, plain = anthropic_request(BASE)
    assert guided_for(plain.conversation, plain.tool_choice, None, HERMES) is None
    assert guided_for(plain.conversation, plain.tool_choice, OutputFormat(None), HERMES).kind is GuidedKind.JSON_OBJECT


def test_tool_stream_stage_turns_text_into_call_outcomes():
    text = 'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'

    async def source():
        for i in range(0, len(text), 5):
            yield TextDelta(text[i : i + 5])
        yield Finished(FinishReason.EOS)

    async def run():
        return [o async for o in with_tool_calls(source(), HERMES, "call_")]

    out = asyncio.run(run())
    assert "".join(o.text for o in out if isinstance(o, TextDelta)) == "Let me check."
    (start,) = [o for o in out if isinstance(o, ToolCallStarted)]
    (done,) = [o for o in out if isinstance(o, ToolCallDone)]
    assert start.id.startswith("call_") and start.id == done.id and done.input == {"city": "Oslo"}
    assert "".join(o.json for o in out if isinstance(o, ToolInputDelta)) == done.arguments
    final = out[-1]
    assert isinstance(final, Finished) and final.tool_calls == 1 and final.called_tools


class _FakeGeneration:
    """What the renderers read from a Generation: the request, the tool format, the outcomes."""

    def __init__(self, outcomes: list, tool_id_prefix: str = "toolu_"):
        from types import SimpleNamespace

        _, sreq = anthropic_request({**BASE, "tools": [WEATHER]})
        sreq.tool_id_prefix = tool_id_prefix
        self.prepared = SimpleNamespace(
            request=sreq, tool_format=HERMES, generation=SimpleNamespace(sampling=sreq.sampling)
        )
        self._outcomes = outcomes

    async def outcomes(self):
        for o in self._outcomes:
            yield o


def _mixed_reply() -> list:
    args = '{"city": "Oslo"}'
    return [
        TextDelta("Let me check."),
        ToolCallStarted(0, "toolu_a", "get_weather"),
        ToolInputDelta(0, args[:7]),
        ToolInputDelta(0, args[7:]),
        ToolCallDone(0, "toolu_a", "get_weather", {"city": "Oslo"}, args),
        Finished(FinishReason.EOS, tool_calls=1),
    ]


def test_anthropic_stream_text_then_tool_use_blocks():
    from sluice.api.anthropic.render import UsagePlan, render_stream

    async def run():
        return [e async for e in render_stream(_FakeGeneration(_mixed_reply()), UsagePlan(None, 16), "req_1")]

    events = [(e.name, json.loads(e.data)) for e in asyncio.run(run()) if e.name != "ping"]
    names = [n for n, _ in events]
    assert names == [
        "message_start",
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
        "content_block_start",
        "content_block_delta",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    assert events[1][1] == {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}
    assert events[4][1]["index"] == 1 and events[4][1]["content_block"] == {
        "type": "tool_use",
        "id": "toolu_a",
        "name": "get_weather",
        "input": {},
    }
    assert "".join(d["delta"]["partial_json"] for n, d in events[5:7]) == '{"city": "Oslo"}'
    assert events[8][1]["delta"]["stop_reason"] == "tool_use"
    from sluice.api.anthropic.render import content_blocks  # the non-streaming reply's content

    assert content_blocks(["Let me check.", _mixed_reply()[4]]) == [
        {"type": "text", "text": "Let me check."},
        {"type": "tool_use", "id": "toolu_a", "name": "get_weather", "input": {"city": "Oslo"}},
    ]
    assert content_blocks([]) == [{"type": "text", "text": ""}]


def test_openai_stream_and_message_with_text_and_tool_calls():
    from sluice.api.openai.render import render_chunks, render_completion
    from sluice.serving.pipeline import Collected

    async def run():
        return [
            e.data
            async for e in render_chunks("chatcmpl_1", [_FakeGeneration(_mixed_reply(), "call_")], False)
            if e.data
        ]

    chunks = [json.loads(d) for d in asyncio.run(run()) if d != "[DONE]"]
    deltas = [c["choices"][0]["delta"] for c in chunks]
    assert deltas[1] == {"content": "Let me check."}
    assert deltas[2]["tool_calls"] == [
        {"index": 0, "id": "toolu_a", "type": "function", "function": {"name": "get_weather", "arguments": ""}}
    ]
    assert "".join(d["tool_calls"][0]["function"]["arguments"] for d in deltas[3:5]) == '{"city": "Oslo"}'
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"
    reply = _mixed_reply()
    body = render_completion(
        "chatcmpl_1", [_FakeGeneration(reply)], [Collected("Let me check.", reply[-1], ["Let me check.", reply[4]])]
    )
    message = body["choices"][0]["message"]
    assert message["content"] == "Let me check." and body["choices"][0]["finish_reason"] == "tool_calls"
    assert message["tool_calls"] == [
        {"id": "toolu_a", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}
    ]
