"""Tool-call markup never reaches a client as text (issue 21 item 3), on both wire formats,
streaming and not, through the official SDKs against the real ASGI app on a scripted engine
(the engine's text is exactly the model output that leaked: two calls, then a third cut by
max_tokens inside its opening tag).

What a cut call becomes (docs/API.md "What still applies"): cut before its name, nothing (the
reply ends with the calls before it); cut after its name, a tool_use / tool_calls entry with
input {} — in both cases `stop_reason: "max_tokens"` / `finish_reason: "length"`."""

from __future__ import annotations

import asyncio
import json

import anthropic
import httpx
import httpx2
import openai
import pytest

from sluice.types import FinishReason
from tests.fake_engine import Script
from tests.fuzz_app import MODEL, scripted_app

WEATHER = {
    "name": "get_weather",
    "description": "Weather.",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
FUNCTION = {"type": "function", "function": {"name": "get_weather", "parameters": WEATHER["input_schema"]}}
ASK = [{"role": "user", "content": "Weather in Oslo and Paris?"}]
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "%s"}}\n</tool_call>\n'
TWO_CALLS = [
    "<tool",
    "_call>\n",
    '{"name": "get_weather", "arguments": {"city": "Oslo"}}',
    "\n</tool_call>\n",
    CALL % "Paris",
]
CUT_IN_TAG = [*TWO_CALLS, "<", "tool"]  # the leak seen: a text block "<tool"
CUT_AFTER_NAME = [*TWO_CALLS, "<tool_call>\n", '{"name": "get_weather", "arguments": {"ci']


@pytest.fixture(scope="module")
def tiny(tiny_llama_dir):
    return tiny_llama_dir


def _run(tiny, texts: list[str], talk):
    async def go():
        app, _, _ = await scripted_app(tiny, Script(texts=texts, finish=FinishReason.LENGTH), max_model_len=2048)
        # the anthropic SDK runs on httpx2, the openai SDK on httpx
        async with (
            httpx2.AsyncClient(transport=httpx2.ASGITransport(app=app), base_url="http://test", timeout=60) as h2,
            httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test", timeout=60) as h1,
        ):
            return await talk(h2, h1)

    return asyncio.run(go())


def _no_markup(text: str | None) -> None:
    assert not text or ("<" not in text and "tool_call" not in text), text


@pytest.mark.parametrize("texts, calls", [(CUT_IN_TAG, 2), (CUT_AFTER_NAME, 3)], ids=["cut-in-tag", "cut-after-name"])
def test_anthropic_reply_cut_inside_a_call_has_no_markup_text(tiny, texts, calls):
    async def talk(http, _):
        client = anthropic.AsyncAnthropic(base_url="http://test", api_key="x", http_client=http, max_retries=0)
        kw = {"model": MODEL, "max_tokens": 64, "messages": ASK, "tools": [WEATHER], "tool_choice": {"type": "any"}}
        msg = await client.messages.create(**kw)
        events = []
        async with client.messages.stream(**kw) as stream:
            async for event in stream:
                events.append(event)
            final = await stream.get_final_message()
        return msg, events, final

    msg, events, final = _run(tiny, texts, talk)
    for reply in (msg, final):
        assert reply.stop_reason == "max_tokens"
        assert [b.type for b in reply.content] == ["tool_use"] * calls
        assert [b.input for b in msg.content] == [{"city": "Oslo"}, {"city": "Paris"}, {}][:calls]
    starts = [e.content_block.type for e in events if e.type == "content_block_start"]
    assert starts == ["tool_use"] * calls
    for e in events:
        if e.type == "content_block_delta":
            assert e.delta.type == "input_json_delta"
    assert "<tool" not in json.dumps([e.model_dump() for e in events])


@pytest.mark.parametrize("texts, calls", [(CUT_IN_TAG, 2), (CUT_AFTER_NAME, 3)], ids=["cut-in-tag", "cut-after-name"])
def test_openai_reply_cut_inside_a_call_has_no_markup_text(tiny, texts, calls):
    async def talk(_, http):
        client = openai.AsyncOpenAI(base_url="http://test/v1", api_key="x", http_client=http, max_retries=0)
        kw = {"model": MODEL, "max_tokens": 64, "messages": ASK, "tools": [FUNCTION], "tool_choice": "required"}
        full = await client.chat.completions.create(**kw)
        chunks = [c async for c in await client.chat.completions.create(**kw, stream=True)]
        return full, chunks

    full, chunks = _run(tiny, texts, talk)
    choice = full.choices[0]
    assert choice.finish_reason == "length"
    _no_markup(choice.message.content)
    assert [c.function.name for c in choice.message.tool_calls] == ["get_weather"] * calls
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    for d in deltas:
        _no_markup(d.content)
    assert len({tc.index for d in deltas for tc in (d.tool_calls or [])}) == calls
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["length"]
    assert "<tool" not in json.dumps([c.model_dump() for c in chunks])
