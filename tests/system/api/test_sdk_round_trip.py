"""The official `anthropic` SDK's tool-use loop against a real `sluice serve` (issue 21 item 2):
send the tools, append the assistant's content blocks, answer with a `tool_result` — with the
blocks passed as the SDK's own objects, through `model_dump()` (which carries every field of the
SDK's reply types, `caller` and `toolset_name` included, as null) and through
`model_dump(exclude_none=True)`, from a streamed and a plain reply, continued streamed and plain.

The other block types a client may send back are sent the same three ways: text, thinking and
redacted_thinking (dropped), a tool_use made by the SDK with a `caller`, tool_result content
lists; the blocks of server tools are a 400 that names the block (none of those tools runs
here), never `Extra inputs are not permitted`. Greedy decoding, small max_tokens."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anthropic
import pytest
from anthropic import types as t
from pydantic import BaseModel

from tests.server_process import MODEL
from tests.system.api.conftest import SHARED_KEY

pytestmark = pytest.mark.slow
GREEDY = {"temperature": 0}
WEATHER = {
    "name": "get_weather",
    "description": "Current weather for a city.",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 24}},
        "required": ["city"],
    },
}
ASK = [{"role": "user", "content": "What's the weather like in Paris?"}]
ONE_CALL = {"type": "any", "disable_parallel_tool_use": True}

# how a client hands the SDK's reply blocks back
PASSING: dict[str, Callable[[Any], Any]] = {
    "as-is": lambda b: b,
    "model_dump": lambda b: b.model_dump(),
    "model_dump-exclude_none": lambda b: b.model_dump(exclude_none=True),
}


@pytest.fixture(scope="module")
def client(shared_server):  # tests/system/api/conftest.py: the bundled model behind SHARED_KEY
    return anthropic.Anthropic(base_url=shared_server.base_url, api_key=SHARED_KEY, max_retries=0)


def _reply(client: anthropic.Anthropic, streamed: bool, **kw: Any) -> t.Message:
    kw = {"model": MODEL, "extra_body": GREEDY, **kw}
    if not streamed:
        return client.messages.create(**kw)
    with client.messages.stream(**kw) as stream:
        return stream.get_final_message()


@pytest.fixture(scope="module")
def first_replies(client) -> dict[bool, t.Message]:
    """The call to answer, from a plain and from a streamed reply (the SDK builds its blocks
    differently: parsed from the JSON body, or accumulated from the events)."""
    out = {}
    for streamed in (False, True):
        msg = _reply(client, streamed, max_tokens=64, messages=ASK, tools=[WEATHER], tool_choice=ONE_CALL)
        assert msg.stop_reason == "tool_use" and [b.type for b in msg.content] == ["tool_use"]
        out[streamed] = msg
    return out


@pytest.mark.parametrize("passing", PASSING)
@pytest.mark.parametrize("first_streamed", [False, True], ids=["from-plain", "from-stream"])
@pytest.mark.parametrize("then_streamed", [False, True], ids=["then-plain", "then-stream"])
def test_tool_result_round_trip(client, first_replies, passing, first_streamed, then_streamed):
    first = first_replies[first_streamed]
    (call,) = first.content
    if passing == "model_dump":
        assert {"caller", "toolset_name"} <= set(call.model_dump())  # what the server once refused
    result: t.ToolResultBlockParam = {
        "type": "tool_result",
        "tool_use_id": call.id,
        "content": [{"type": "text", "text": "rain, 4 degrees"}],
    }
    history = [
        *ASK,
        {"role": "assistant", "content": [PASSING[passing](b) for b in first.content]},
        {"role": "user", "content": [result]},
    ]
    second = _reply(client, then_streamed, max_tokens=8, messages=history, tools=[WEATHER])
    assert second.stop_reason in ("end_turn", "max_tokens", "tool_use") and second.content


def _assistant_blocks() -> list[Any]:
    """Every other assistant-side block type a client may send back, as the SDK's own objects."""
    return [
        t.ThinkingBlock(type="thinking", thinking="The user wants the weather.", signature="c2ln"),
        t.RedactedThinkingBlock(type="redacted_thinking", data="ZW5jcnlwdGVk"),
        t.TextBlock(type="text", text="Checking.", citations=None),
        t.ToolUseBlock(
            type="tool_use",
            id="toolu_01AbCdEfGhIjKlMnOpQrStUv",
            name="get_weather",
            input={"city": "Paris"},
            caller=t.DirectCaller(type="direct"),
            toolset_name=None,
        ),
    ]


@pytest.mark.parametrize("passing", PASSING)
@pytest.mark.parametrize("streamed", [False, True], ids=["plain", "stream"])
def test_every_client_block_type_round_trips(client, passing, streamed):
    blocks = [PASSING[passing](b) for b in _assistant_blocks()]
    results: list[t.ToolResultBlockParam] = [
        {
            "type": "tool_result",
            "tool_use_id": "toolu_01AbCdEfGhIjKlMnOpQrStUv",
            "is_error": False,
            "cache_control": None,
            "toolset_name": None,
            "content": [
                {"type": "text", "text": "rain, 4 degrees", "citations": None, "cache_control": {"type": "ephemeral"}},
                {
                    "type": "search_result",
                    "source": "https://example.com/w",
                    "title": "Weather",
                    "content": [{"type": "text", "text": "Paris: rain"}],
                },
                {"type": "tool_reference", "tool_name": "get_weather"},
            ],
        }
    ]
    history = [*ASK, {"role": "assistant", "content": blocks}, {"role": "user", "content": results}]
    reply = _reply(client, streamed, max_tokens=4, messages=history, tools=[WEATHER])
    assert reply.content and reply.stop_reason in ("end_turn", "max_tokens", "tool_use")


def _server_tool_blocks() -> list[Any]:
    """The blocks of the server tools that do not run here (web search's are read: below)."""

    def error(kind: str) -> dict[str, str]:  # each result type's own error object
        return {"type": f"{kind}_error", "error_code": "unavailable"}

    results: list[tuple[type[BaseModel], str]] = [
        (t.WebFetchToolResultBlock, "web_fetch_tool_result"),
        (t.CodeExecutionToolResultBlock, "code_execution_tool_result"),
        (t.BashCodeExecutionToolResultBlock, "bash_code_execution_tool_result"),
        (t.TextEditorCodeExecutionToolResultBlock, "text_editor_code_execution_tool_result"),
        (t.ToolSearchToolResultBlock, "tool_search_tool_result"),
    ]
    return [
        *(cls.model_construct(type=kind, tool_use_id="srvtoolu_1", content=error(kind)) for cls, kind in results),
        t.ContainerUploadBlock(type="container_upload", file_id="file_1"),
    ]


def _web_search_pair() -> list[Any]:
    """A search tool call and its result, as the SDK parsed them from a reply (the search tool:
    docs/SEARCH.md); sent back, they are the conversation's call and result."""
    call = t.ServerToolUseBlock(
        type="server_tool_use",
        id="srvtoolu_1",
        name="web_search",
        input={"query": "paris weather"},
        caller=t.DirectCaller(type="direct"),
    )
    hit = t.WebSearchResultBlock(
        type="web_search_result",
        url="sluice-search:paris",
        title="Paris weather",
        encrypted_content="UmFpbi4=",
        page_age=None,
    )  # base64 of "Rain."
    return [call, t.WebSearchToolResultBlock(type="web_search_tool_result", tool_use_id="srvtoolu_1", content=[hit])]


@pytest.mark.parametrize("passing", PASSING)
def test_web_search_blocks_are_read_and_other_server_tool_blocks_refused_by_name(client, passing):
    history = [
        *ASK,
        {"role": "assistant", "content": [PASSING[passing](b) for b in _web_search_pair()]},
        {"role": "user", "content": "go on"},
    ]
    assert client.messages.create(model=MODEL, max_tokens=2, messages=history).content
    for block in _server_tool_blocks():
        history = [
            *ASK,
            {"role": "assistant", "content": [PASSING[passing](block)]},
            {"role": "user", "content": "go on"},
        ]
        with pytest.raises(anthropic.BadRequestError) as info:
            client.messages.create(model=MODEL, max_tokens=4, messages=history)
        message = info.value.body["error"]["message"]
        assert (
            message
            == f"messages.1.content.0: {block.type} blocks are not supported: no server tool but 'web_search' runs here"
        )
