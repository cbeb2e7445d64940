"""The search tool on the Anthropic wire, without a server: the declared tool → serving's terms,
search blocks sent back → the conversation the model reads, and the reply's blocks and usage
as the official SDK's types parse them."""

from __future__ import annotations

import json

import pytest
from anthropic import types as t

from sluice.api.anthropic.convert import parse_body, to_serving_request
from sluice.api.anthropic.render import UsagePlan, content_blocks, message_object, stop_reason
from sluice.api.anthropic.schema import MessagesRequest
from sluice.api.anthropic.search_blocks import encode_text, result_block
from sluice.config import Settings
from sluice.gateway.principal import Principal
from sluice.serving.errors import ServingError
from sluice.serving.outcomes import Finished, ServerToolResult, ToolCallDone
from sluice.serving.search_tool.search_error import SearchToolError
from sluice.tool_types import Role, SearchResult, SearchToolUse, ToolCall, ToolResult, search_tool_spec
from sluice.types import FinishReason, Usage

TOOL = {"type": "web_search_20250305", "name": "web_search"}
ASK = [{"role": "user", "content": "Weather in Paris?"}]


def _request(**body):
    raw = {"model": "m", "max_tokens": 16, "messages": ASK} | body
    req = parse_body(json.dumps(raw).encode(), MessagesRequest, lenient=False)
    return to_serving_request(req, Principal(), "msg_1", "2023-06-01", Settings())


def test_the_declared_tool_is_offered_as_a_query_tool():
    sreq = _request(
        tools=[TOOL | {"max_uses": 2, "cache_control": {"type": "ephemeral"}}],
        tool_choice={"type": "tool", "name": "web_search"},
    )
    assert sreq.search_tool == SearchToolUse("web_search", 2) and sreq.server_tool_names == {"web_search"}
    assert sreq.conversation.tools == [search_tool_spec("web_search")]
    assert sreq.dedup_body is None  # a reply that searches is never shared nor cached
    assert _request().search_tool is None and _request().dedup_body is not None


@pytest.mark.parametrize(
    "tool,problem",
    [
        (TOOL | {"name": "search"}, "tools.0.name: Input should be 'web_search'"),
        (
            TOOL | {"allowed_domains": ["a.org"], "blocked_domains": ["b.org"]},
            "tools.0: use either allowed_domains or blocked_domains, not both",
        ),
        (TOOL | {"allowed_domains": ["https://a.org"]}, "tools.0: 'https://a.org': give the domain without a scheme"),
        (TOOL | {"blocked_domains": ["*.a.org"]}, "tools.0: '*.a.org': a wildcard may only follow the domain"),
        (TOOL | {"blocked_domains": ["a.org/*/b/*"]}, "tools.0: 'a.org/*/b/*': at most one wildcard"),
        (TOOL | {"allowed_domains": "a.org"}, "tools.0.allowed_domains: Input should be a list of strings"),
        (TOOL | {"user_location": {"type": "exact"}}, "tools.0.user_location.type: Input should be 'approximate'"),
        (
            TOOL | {"user_location": {"type": "approximate", "street": "x"}},
            "tools.0.user_location.street: Extra inputs",
        ),
        (TOOL | {"max_uses": 0}, "tools.0.max_uses: Input should be an integer greater than or equal to 1"),
        (TOOL | {"input_schema": {"type": "object"}}, "tools.0.input_schema: Extra inputs are not permitted"),
        (TOOL | {"allowed_callers": ["code_execution_20250825"]}, "tools.0.allowed_callers: only 'direct'"),
        (
            {"type": "web_fetch_20250910", "name": "web_fetch"},
            "tools.0.type: server tool 'web_fetch_20250910' is not supported",
        ),
    ],
)
def test_what_the_search_tool_cannot_do_is_a_400(tool, problem):
    with pytest.raises(ServingError) as exc:
        _request(tools=[tool])
    assert exc.value.message.startswith(problem)


def test_domains_and_a_location_are_accepted():
    sreq = _request(
        tools=[
            TOOL
            | {
                "allowed_domains": ["example.com", "docs.foo.org/guide/*"],
                "user_location": {"type": "approximate", "city": "Paris", "country": "FR", "timezone": "Europe/Paris"},
            }
        ]
    )
    assert sreq.search_tool == SearchToolUse("web_search", None, ("example.com", "docs.foo.org/guide/*"), None)
    assert _request(tools=[TOOL | {"blocked_domains": ["spam.org"]}]).search_tool.blocked_domains == ("spam.org",)


def test_declared_twice_is_a_400():
    with pytest.raises(ServingError, match="declared twice"):
        _request(tools=[TOOL, TOOL | {"type": "web_search_20260209"}])


def test_search_blocks_sent_back_are_the_call_and_its_result_in_order():
    hit = {
        "type": "web_search_result",
        "url": "sluice-search:p",
        "title": "Paris",
        "encrypted_content": encode_text("Mild."),
        "page_age": "April 30, 2025",
    }
    assistant = [
        {"type": "text", "text": "Let me look."},
        {"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search", "input": {"query": "paris"}},
        {"type": "web_search_tool_result", "tool_use_id": "srvtoolu_1", "content": [hit]},
        {"type": "server_tool_use", "id": "srvtoolu_2", "name": "web_search", "input": {"query": "x"}},
        {
            "type": "web_search_tool_result",
            "tool_use_id": "srvtoolu_2",
            "content": {"type": "web_search_tool_result_error", "error_code": "unavailable"},
        },
        {"type": "text", "text": "It is mild"},
    ]
    conv = _request(tools=[TOOL], messages=[*ASK, {"role": "assistant", "content": assistant}]).conversation
    assert [t.role for t in conv.turns] == [Role.USER, Role.ASSISTANT, Role.USER, Role.ASSISTANT, Role.USER]
    assert conv.turns[1].parts == ["Let me look.", ToolCall("srvtoolu_1", "web_search", {"query": "paris"})]
    rendered = SearchResult("sluice-search:p", "Paris", "Mild.", "April 30, 2025").render()
    assert conv.turns[2].parts == [ToolResult("srvtoolu_1", rendered)] and "April 30, 2025" in rendered
    assert conv.turns[4].parts == [ToolResult("srvtoolu_2", "search error: unavailable", is_error=True)]
    assert conv.prefill == "It is mild"  # the reply continues after the searches


def test_a_result_not_from_this_server_is_a_400():
    bad = {
        "type": "web_search_tool_result",
        "tool_use_id": "srvtoolu_1",
        "content": [{"type": "web_search_result", "url": "u", "title": "t", "encrypted_content": "%%%"}],
    }
    call = {"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search", "input": {"query": "q"}}
    with pytest.raises(ServingError, match="encrypted_content"):
        _request(messages=[*ASK, {"role": "assistant", "content": [call, bad]}])


def test_the_reply_parses_as_the_sdks_message():
    usage = Usage(30, 12, 0)
    call = ToolCallDone(0, "srvtoolu_1", "web_search", {"query": "paris"}, '{"query": "paris"}', True, usage, True)
    found = ServerToolResult("srvtoolu_1", [SearchResult("sluice-search:p", "Paris", "Mild.", "2 days ago")])
    failed = ServerToolResult("srvtoolu_2", error=SearchToolError.UNAVAILABLE)
    final = Finished(FinishReason.EOS, usage=usage, server_tool_uses=1, paused=True)
    plan = UsagePlan(None, 16, search_tool=True)
    body = message_object(
        "msg_1",
        "m",
        content_blocks(["Let me look.", call, found, failed]),
        stop_reason(final),
        None,
        plan.usage(final.usage, final.server_tool_uses),
    )
    msg = t.Message.model_validate(body)
    assert [b.type for b in msg.content] == [
        "text",
        "server_tool_use",
        "web_search_tool_result",
        "web_search_tool_result",
    ]
    assert isinstance(msg.content[2].content[0], t.WebSearchResultBlock) and msg.content[2].content[0].title == "Paris"
    assert msg.content[2].content[0].page_age == "2 days ago"
    assert msg.content[3].content.error_code == "unavailable"
    assert msg.stop_reason == "pause_turn" and msg.usage.server_tool_use.web_search_requests == 1
    assert result_block(found)["content"][0]["encrypted_content"] == encode_text("Mild.")
    assert "server_tool_use" not in UsagePlan(None, 16).usage(usage)  # not declared: not reported
