"""Tool use and structured outputs end to end: the official `anthropic` and `openai` SDKs
against a real `sluice serve` with the bundled model (grammar-constrained decoding).

Greedy decoding everywhere, small max_tokens; every reply that must be JSON is checked with
`jsonschema`, so a broken grammar, parser or renderer fails here whatever the model says.
One server for the module; its safety policy bans a canary literal that only a tool input can
contain, to prove the stream guard reads tool inputs too."""

from __future__ import annotations

import copy
import json
from importlib import resources

import anthropic
import httpx
import jsonschema
import openai
import pytest

from tests.server_process import MODEL, start_server

pytestmark = pytest.mark.slow
GREEDY = {"temperature": 0}
CANARY = "zebra-canary-seventy-one"
WEATHER = {
    "name": "get_weather",
    "description": "Current weather for a city.",
    "input_schema": {
        "type": "object",
        "properties": {
            "city": {"type": "string", "maxLength": 24},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
        },
        "required": ["city", "unit"],
        "additionalProperties": False,
    },
}
TIME = {
    "name": "get_time",
    "description": "The local time in a timezone.",
    "input_schema": {
        "type": "object",
        "properties": {"timezone": {"type": "string", "maxLength": 32}},
        "required": ["timezone"],
    },
}
CODE = {  # its only possible input contains the banned canary
    "name": "submit_code",
    "description": "Submit the code.",
    "input_schema": {"type": "object", "properties": {"code": {"const": CANARY}}, "required": ["code"]},
}
PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 20},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "hobbies": {"type": "array", "items": {"type": "string", "maxLength": 16}, "maxItems": 2},
    },
    "required": ["name", "age", "hobbies"],
    "additionalProperties": False,
}
ASK = [{"role": "user", "content": "What's the weather like in Paris?"}]
# One call: left free, the bundled 135M model calls the same tool again and again until
# max_tokens (the grammar allows parallel calls; the model does not know when to stop).
ANY = {"type": "any", "disable_parallel_tool_use": True}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    policy = tmp_path_factory.mktemp("policy") / "policy.toml"
    default = resources.files("sluice.safety").joinpath("default_policy.toml").read_text()
    policy.write_text(default + f'\n[categories.test_tool_input]\nliterals = ["{CANARY}"]\ninput_action = "allow"\n')
    proc = start_server(env={"SLUICE_SAFETY_POLICY": str(policy)})
    yield proc
    assert proc.stop() == 0


@pytest.fixture(scope="module")
def client(server) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.base_url, api_key="x", max_retries=0)


@pytest.fixture(scope="module")
def oai(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key="x", max_retries=0)


def create(client: anthropic.Anthropic, messages=ASK, max_tokens: int = 64, extra_body=GREEDY, **kw):
    return client.messages.create(model=MODEL, max_tokens=max_tokens, messages=messages, extra_body=extra_body, **kw)


def tool_uses(message) -> list:
    return [b for b in message.content if b.type == "tool_use"]


def without_ids(message) -> dict:
    body = message.model_dump()
    body.pop("id")
    for block in body["content"]:
        block.pop("id", None)
    return body


# -- Anthropic ---------------------------------------------------------------------------------
def test_forced_any_tool_call_validates(client):
    msg = create(client, tools=[WEATHER], tool_choice=ANY)
    assert msg.stop_reason == "tool_use"
    (call,) = tool_uses(msg)  # forced: the call is the first block
    assert msg.content[0] is call
    assert call.id.startswith("toolu_") and len(call.id) == len("toolu_") + 24
    assert call.name == "get_weather"
    jsonschema.validate(call.input, WEATHER["input_schema"])


def test_forced_named_tool_call(client):
    msg = create(
        client,
        tools=[WEATHER, TIME],
        tool_choice={"type": "tool", "name": "get_time", "disable_parallel_tool_use": True},
    )
    assert msg.stop_reason == "tool_use"
    calls = tool_uses(msg)
    assert len(calls) == 1 and calls[0].name == "get_time"  # disable_parallel_tool_use: one call
    jsonschema.validate(calls[0].input, TIME["input_schema"])


def test_stream_input_json_deltas_concatenate_to_the_input(client):
    kw = {"tools": [WEATHER], "tool_choice": ANY}
    pieces: list[str] = []
    kinds: list[str] = []
    with client.messages.stream(model=MODEL, max_tokens=64, messages=ASK, extra_body=GREEDY, **kw) as stream:
        for event in stream:
            kinds.append(event.type)
            if event.type == "content_block_start":
                assert event.content_block.type == "tool_use" and event.content_block.input == {}
            if event.type == "content_block_delta":
                assert event.delta.type == "input_json_delta"
                pieces.append(event.delta.partial_json)
        final = stream.get_final_message()
    assert len(pieces) > 1  # streamed in pieces, not as one blob at the end
    (call,) = tool_uses(final)
    assert json.loads("".join(pieces)) == call.input
    jsonschema.validate(call.input, WEATHER["input_schema"])
    assert final.stop_reason == "tool_use"
    assert without_ids(final) == without_ids(create(client, **kw))  # greedy: the same reply either way


def test_tool_result_round_trip(client):
    first = create(client, tools=[WEATHER], tool_choice=ANY)
    (call,) = tool_uses(first)
    for content in ("rain, 4 degrees", [{"type": "text", "text": "rain, 4 degrees"}]):
        history = [
            *ASK,
            {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id, "content": content}]},
        ]
        second = create(client, messages=history, max_tokens=24, tools=[WEATHER])
        assert second.content and second.content[0].type in ("text", "tool_use")
        assert second.stop_reason in ("end_turn", "max_tokens", "tool_use")
    # an is_error result is rendered (differently: the prompt grows by the error prefix)
    base = {"model": MODEL, "tools": [WEATHER]}
    ok = history[:-1] + [
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "boom"}]}
    ]
    bad = copy.deepcopy(ok)
    bad[-1]["content"][0]["is_error"] = True
    n_ok = client.messages.count_tokens(messages=ok, **base).input_tokens
    n_bad = client.messages.count_tokens(messages=bad, **base).input_tokens
    assert n_bad > n_ok


def test_tool_pairs_and_choice_are_checked(client):
    orphan = [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_nope", "content": "x"}]}]
    with pytest.raises(anthropic.BadRequestError) as info:
        create(client, messages=orphan, tools=[WEATHER])
    assert "toolu_nope" in info.value.message
    unanswered = [
        *ASK,
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {}}]},
        {"role": "user", "content": "well?"},
    ]
    with pytest.raises(anthropic.BadRequestError, match="without tool_result"):
        create(client, messages=unanswered, tools=[WEATHER])
    with pytest.raises(anthropic.BadRequestError, match="nosuch"):
        create(client, tools=[WEATHER], tool_choice={"type": "tool", "name": "nosuch"})
    with pytest.raises(anthropic.BadRequestError, match="web_search"):
        create(client, tools=[{"type": "web_search_20250305", "name": "web_search"}])


def test_unsupported_schema_keyword_is_a_400_before_any_stream(client):
    tool = {
        "name": "tag",
        "strict": True,
        "input_schema": {
            "type": "object",
            "properties": {"tags": {"type": "array", "items": {"type": "string"}, "uniqueItems": True}},
        },
    }
    with pytest.raises(anthropic.BadRequestError) as info:
        create(client, tools=[tool], tool_choice=ANY)
    assert info.value.body["error"]["type"] == "invalid_request_error" and "uniqueItems" in info.value.message
    with pytest.raises(anthropic.BadRequestError, match="oneOf"):  # streaming: a real 400, not an error event
        with client.messages.stream(
            model=MODEL,
            max_tokens=8,
            messages=ASK,
            extra_body={
                "output_config": {
                    "format": {"type": "json_schema", "schema": {"oneOf": [{"type": "string"}, {"type": "integer"}]}}
                }
            },
        ):
            pass


def test_output_config_json_schema(client, server):
    msg = create(
        client,
        messages=[{"role": "user", "content": "Describe a person."}],
        max_tokens=80,
        output_config={"format": {"type": "json_schema", "schema": PERSON}},
    )
    assert msg.stop_reason == "end_turn" and msg.content[0].type == "text"
    jsonschema.validate(json.loads(msg.content[0].text), PERSON)
    # the beta spelling, with its header (the SDK's beta client sends it); without it, refused
    beta = client.beta.messages.create(
        model=MODEL,
        max_tokens=80,
        messages=[{"role": "user", "content": "Describe a person."}],
        betas=["structured-outputs-2025-11-13"],
        extra_body={**GREEDY, "output_format": {"type": "json_schema", "schema": PERSON}},
    )
    assert json.loads(beta.content[0].text) == json.loads(msg.content[0].text)
    body = {
        "model": MODEL,
        "max_tokens": 80,
        "temperature": 0,
        "messages": [{"role": "user", "content": "Describe a person."}],
        "output_format": {"type": "json_schema", "schema": PERSON},
    }
    headers = {"x-api-key": "x", "anthropic-version": "2023-06-01"}
    r = httpx.post(server.base_url + "/v1/messages", json=body, headers=headers, timeout=60)
    assert r.status_code == 400 and "anthropic-beta" in r.json()["error"]["message"]


def test_count_tokens_counts_tools(client):
    plain = client.messages.count_tokens(model=MODEL, messages=ASK).input_tokens
    one = client.messages.count_tokens(model=MODEL, messages=ASK, tools=[WEATHER]).input_tokens
    two = client.messages.count_tokens(model=MODEL, messages=ASK, tools=[WEATHER, TIME]).input_tokens
    assert plain < one < two
    msg = create(client, max_tokens=4, tools=[WEATHER, TIME])
    assert msg.usage.input_tokens + msg.usage.cache_read_input_tokens + msg.usage.cache_creation_input_tokens == two


def test_stream_guard_reads_tool_inputs(client):
    msg = create(client, tools=[CODE], tool_choice=ANY)
    assert msg.stop_reason == "refusal" and msg.stop_details.category == "test_tool_input"
    assert CANARY not in json.dumps(msg.model_dump())
    with client.messages.stream(
        model=MODEL, max_tokens=64, messages=ASK, extra_body=GREEDY, tools=[CODE], tool_choice=ANY
    ) as stream:
        final = stream.get_final_message()
    assert final.stop_reason == "refusal" and CANARY not in json.dumps(final.model_dump())


def test_calls_cut_by_max_tokens_leave_no_markup_on_either_wire(client, oai):
    # issue 21: parallel calls allowed, max_tokens 64 — two tool_use blocks, then a text block
    # "<tool" (the third call cut inside its tag). The scripted version of every cut point:
    # tests/system/api/test_tool_markup.py.
    for max_tokens in (40, 64):
        kw = {"max_tokens": max_tokens, "tools": [WEATHER], "tool_choice": {"type": "any"}}
        msg = create(client, **kw)
        with client.messages.stream(model=MODEL, messages=ASK, extra_body=GREEDY, **kw) as stream:
            final = stream.get_final_message()
        for reply in (msg, final):
            assert reply.stop_reason in ("max_tokens", "tool_use") and reply.content
            assert all(b.type == "tool_use" for b in reply.content), reply.content
        chat = {
            "model": MODEL,
            "messages": ASK,
            "max_tokens": max_tokens,
            "temperature": 0,
            "tools": [_function(WEATHER)],
            "tool_choice": "required",
        }
        full = oai.chat.completions.create(**chat)
        assert not full.choices[0].message.content and full.choices[0].message.tool_calls
        streamed = "".join(
            c.choices[0].delta.content or "" for c in oai.chat.completions.create(**chat, stream=True) if c.choices
        )
        assert streamed == ""


# -- OpenAI ------------------------------------------------------------------------------------
def _function(tool: dict) -> dict:
    return {
        "type": "function",
        "function": {"name": tool["name"], "description": tool["description"], "parameters": tool["input_schema"]},
    }


def test_openai_tool_calls_non_streaming_and_streaming(oai):
    kw = {
        "model": MODEL,
        "messages": ASK,
        "max_tokens": 64,
        "temperature": 0,
        "tools": [_function(WEATHER)],
        "tool_choice": "required",
        "parallel_tool_calls": False,
    }
    full = oai.chat.completions.create(**kw)
    choice = full.choices[0]
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls
    assert call.id.startswith("call_") and call.type == "function" and call.function.name == "get_weather"
    jsonschema.validate(json.loads(call.function.arguments), WEATHER["input_schema"])
    chunks = list(oai.chat.completions.create(**kw, stream=True))
    deltas = [tc for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
    assert deltas[0].index == 0 and deltas[0].id.startswith("call_") and deltas[0].function.name == "get_weather"
    assert all(d.index == 0 for d in deltas) and len(deltas) > 2
    assert "".join(d.function.arguments or "" for d in deltas) == call.function.arguments
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["tool_calls"]
    # the SDK's own stream accumulator agrees
    with oai.chat.completions.stream(**kw) as stream:
        final = stream.get_final_completion()
    assert final.choices[0].message.tool_calls[0].function.arguments == call.function.arguments
    # named function, and the tool result round trip (role: "tool")
    named = oai.chat.completions.create(
        **{
            **kw,
            "tools": [_function(WEATHER), _function(TIME)],
            "tool_choice": {"type": "function", "function": {"name": "get_time"}},
        }
    )
    assert named.choices[0].message.tool_calls[0].function.name == "get_time"
    history = [
        *ASK,
        choice.message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "rain, 4 degrees"},
    ]
    after = oai.chat.completions.create(**{**kw, "messages": history, "tool_choice": "auto", "max_tokens": 16})
    assert after.choices[0].finish_reason in ("stop", "length", "tool_calls")


def test_openai_response_format(oai):
    kw = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Describe a person."}],
        "max_tokens": 80,
        "temperature": 0,
    }
    r = oai.chat.completions.create(
        **kw,
        response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}},
    )
    assert r.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(r.choices[0].message.content), PERSON)
    obj = oai.chat.completions.create(**kw, response_format={"type": "json_object"})
    assert isinstance(json.loads(obj.choices[0].message.content), dict)
    with pytest.raises(openai.BadRequestError, match="uniqueItems"):
        oai.chat.completions.create(
            **kw,
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "x", "schema": {"type": "array", "uniqueItems": True}},
            },
        )
