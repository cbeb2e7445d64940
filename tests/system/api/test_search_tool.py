"""The Messages API search tool end to end: the official `anthropic` SDK against a real
`sluice serve` whose fleet attaches a real `sluice search` router (one shard, a few documents,
API keys on), with the bundled model under greedy decoding.

The tool is declared as Anthropic's `web_search_20250305` and forced with
`tool_choice {"type": "tool", "name": "web_search"}`, so the model's first act is always a search
call (grammar-constrained: `{"query": string}`); what it writes after reading the results is
the model's, so only its shape is checked. One server and one router for the module; the last
test stops the router and then reloads the fleet without it."""

from __future__ import annotations

import base64
import json
import os
import signal

import anthropic
import httpx
import pytest
from anthropic.types import ToolChoiceToolParam, WebSearchTool20250305Param

from tests.fleet_process import ADMIN, admin, local_version
from tests.server_process import MODEL, metric, start_server
from tests.system.search.cluster import ingest, start_router

pytestmark = pytest.mark.slow
GREEDY = {"temperature": 0}
SEARCH_KEY, INGEST_KEY = "search-key-for-the-fleet", "ingest-key-1"
ROUTER_CONFIG = f'[search]\napi_keys = ["{SEARCH_KEY}"]\ningest_keys = ["{INGEST_KEY}"]\n[[shards]]\nname = "only"\n'
DOCS = [
    {"id": "paris", "title": "Paris weather", "body": "The weather in Paris is mild and rainy."},
    {
        "id": "berlin",
        "title": "Berlin weather",
        "body": "Berlin has cold winters.",
        "url": "https://example.org/berlin",
    },
    {"id": "apt", "title": "apt", "body": "apt is the Debian package manager."},
    {
        "id": "spam",
        "title": "Paris forecast",
        "body": "The weather in Paris today: sun, then weather.",
        "url": "https://ads.spam.example.net/paris",
    },
    {
        "id": "docs",
        "title": "Paris climate",
        "body": "The weather in Paris, by month.",
        "url": "https://docs.example.org/paris",
    },
]
QUESTION = "What is the weather in Paris?"
TOOL: WebSearchTool20250305Param = {"type": "web_search_20250305", "name": "web_search", "max_uses": 1}
FORCED: ToolChoiceToolParam = {"type": "tool", "name": "web_search", "disable_parallel_tool_use": True}


def _fleet(search_url: str | None) -> str:
    search = f'\n[search]\nurl = "{search_url}"\napi_key_env = "TEST_SEARCH_KEY"\ntimeout_s = 2\n' if search_url else ""
    return local_version(MODEL, "v1", 100) + search


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("search-tool")
    router = start_router(tmp, ROUTER_CONFIG)
    server = None
    try:
        ingest(router.url, DOCS, key=INGEST_KEY)
        fleet = tmp / "fleet.toml"
        fleet.write_text(_fleet(router.url))
        # the client's own key ("x") is not the search service's: every search uses the fleet's
        server = start_server(["--fleet", str(fleet)], env={"TEST_SEARCH_KEY": SEARCH_KEY, "SLUICE_ADMIN_KEY": ADMIN})
        yield router, server, fleet
    finally:
        if server is not None:
            server.stop()
        router.stop()


@pytest.fixture(scope="module")
def client(cluster) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=cluster[1].base_url, api_key="x", max_retries=0)


def _ask(client: anthropic.Anthropic, **kw):
    return client.messages.create(
        model=MODEL,
        max_tokens=48,
        extra_body=GREEDY,
        tools=[TOOL],
        tool_choice=FORCED,
        messages=[{"role": "user", "content": QUESTION}],
        **kw,
    )


def _check_search_blocks(content) -> str:
    """The reply opens with the search call and its result; returns the query."""
    call, result = content[0], content[1]
    assert call.type == "server_tool_use" and call.name == "web_search" and call.id.startswith("srvtoolu_")
    assert isinstance(call.input["query"], str) and call.input["query"]
    assert result.type == "web_search_tool_result" and result.tool_use_id == call.id
    assert isinstance(result.content, list) and result.content, result
    hit = {h.title: h for h in result.content}["Paris weather"]
    assert hit.type == "web_search_result" and hit.url == "sluice-search:paris"
    assert base64.urlsafe_b64decode(hit.encrypted_content).decode() == DOCS[0]["body"]
    return call.input["query"]


def test_a_forced_search_returns_its_call_results_and_usage(cluster, client):
    router, server, _ = cluster
    msg = _ask(client)
    query = _check_search_blocks(msg.content)
    assert msg.usage.server_tool_use is not None and msg.usage.server_tool_use.web_search_requests == 1
    assert msg.stop_reason in ("end_turn", "max_tokens", "pause_turn")
    assert all(b.type in ("text", "server_tool_use", "web_search_tool_result") for b in msg.content[2:])
    log = server.log()  # no prompt text in the logs: neither the question nor the model's query
    assert QUESTION not in log and json.dumps(query)[1:-1] not in log


def test_a_streamed_search_sends_the_same_blocks(client):
    with client.messages.stream(
        model=MODEL,
        max_tokens=48,
        extra_body=GREEDY,
        tools=[TOOL],
        tool_choice=FORCED,
        messages=[{"role": "user", "content": QUESTION}],
    ) as stream:
        events = list(stream)
        final = stream.get_final_message()
    starts = [e.content_block.type for e in events if e.type == "content_block_start"]
    assert starts[:2] == ["server_tool_use", "web_search_tool_result"]
    pieces = "".join(e.delta.partial_json for e in events if e.type == "content_block_delta" and e.index == 0)
    query = _check_search_blocks(final.content)
    assert json.loads(pieces) == {"query": query}
    assert final.usage.server_tool_use.web_search_requests == 1


def test_the_reply_can_be_sent_back_to_continue(client):
    first = _ask(client)
    history = [
        {"role": "user", "content": QUESTION},
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
        {"role": "user", "content": "And in Berlin?"},
    ]
    counted = client.messages.count_tokens(model=MODEL, tools=[TOOL], messages=history)
    assert counted.input_tokens > 0
    again = client.messages.create(model=MODEL, max_tokens=4, extra_body=GREEDY, tools=[TOOL], messages=history)
    assert again.usage.server_tool_use is not None  # declared: counted, even when the model searches nothing


def _sent_back(reply, **hit_changes):
    """The conversation a client continues with: the question, the reply's blocks as the SDK
    dumps them (each search result changed by `hit_changes`), a follow-up question."""
    blocks = [b.model_dump(exclude_none=True) for b in reply.content]
    for b in blocks:
        if b["type"] == "web_search_tool_result" and isinstance(b["content"], list):
            b["content"] = [] if hit_changes.get("drop") else [h | hit_changes for h in b["content"]]
    return [
        {"role": "user", "content": QUESTION},
        {"role": "assistant", "content": blocks},
        {"role": "user", "content": "And in Berlin?"},
    ]


def _prompt_tokens(usage) -> int:
    return usage.input_tokens + (usage.cache_read_input_tokens or 0) + (usage.cache_creation_input_tokens or 0)


def test_earlier_search_blocks_are_read_into_the_next_turns_prompt(client):
    """A later turn carrying the earlier `server_tool_use` + `web_search_tool_result` blocks is
    accepted, streaming and not, and its results are in the prompt: without them, or with a
    page_age added, the prompt has another length; the replies' prompt is the counted one."""
    first = _ask(client)
    history = _sent_back(first)
    counted = client.messages.count_tokens(model=MODEL, tools=[TOOL], messages=history).input_tokens
    without = client.messages.count_tokens(
        model=MODEL, tools=[TOOL], messages=_sent_back(first, drop=True)
    ).input_tokens
    aged = client.messages.count_tokens(
        model=MODEL, tools=[TOOL], messages=_sent_back(first, page_age="April 30, 2025")
    ).input_tokens
    assert counted > without + 5 and aged > counted
    again = client.messages.create(model=MODEL, max_tokens=4, extra_body=GREEDY, tools=[TOOL], messages=history)
    with client.messages.stream(model=MODEL, max_tokens=4, extra_body=GREEDY, tools=[TOOL], messages=history) as stream:
        streamed = stream.get_final_message()
    assert _prompt_tokens(again.usage) == counted == _prompt_tokens(streamed.usage)


def _urls(reply) -> set[str]:
    return {
        h.url
        for b in reply.content
        if b.type == "web_search_tool_result" and isinstance(b.content, list)
        for h in b.content
    }


def test_a_hit_from_a_blocked_domain_never_reaches_the_model(client):
    """blocked_domains drops every hit under the domain (subdomains included); allowed_domains
    keeps only those under it — streaming and not; user_location is accepted."""
    open_reply = _ask(client)
    assert "https://ads.spam.example.net/paris" in _urls(open_reply)  # the query finds it when nothing blocks it
    blocked = {**TOOL, "blocked_domains": ["example.net"], "user_location": {"type": "approximate", "country": "FR"}}
    reply = client.messages.create(
        model=MODEL,
        max_tokens=48,
        extra_body=GREEDY,
        tools=[blocked],
        tool_choice=FORCED,
        messages=[{"role": "user", "content": QUESTION}],
    )
    with client.messages.stream(
        model=MODEL,
        max_tokens=48,
        extra_body=GREEDY,
        tools=[blocked],
        tool_choice=FORCED,
        messages=[{"role": "user", "content": QUESTION}],
    ) as stream:
        streamed = stream.get_final_message()
    for r in (reply, streamed):
        assert _urls(r) and not any("example.net" in u for u in _urls(r)), _urls(r)
        assert all(
            "sun, then" not in base64.urlsafe_b64decode(h.encrypted_content).decode()
            for b in r.content
            if b.type == "web_search_tool_result" and isinstance(b.content, list)
            for h in b.content
        )
    allowed = {**TOOL, "allowed_domains": ["example.org/paris"]}
    only = client.messages.create(
        model=MODEL,
        max_tokens=48,
        extra_body=GREEDY,
        tools=[allowed],
        tool_choice=FORCED,
        messages=[{"role": "user", "content": QUESTION}],
    )
    assert _urls(only) == {"https://docs.example.org/paris"}
    with pytest.raises(anthropic.BadRequestError, match="not both"):
        client.messages.create(
            model=MODEL,
            max_tokens=8,
            tools=[{**allowed, "blocked_domains": ["x.org"]}],
            messages=[{"role": "user", "content": QUESTION}],
        )


def test_a_stopped_search_service_is_an_error_result_and_no_service_a_400(cluster, client):
    router, server, fleet = cluster
    os.kill(router.pid, signal.SIGSTOP)  # hung: the search times out (timeout_s = 2)
    try:
        msg = _ask(client)
    finally:
        os.kill(router.pid, signal.SIGCONT)
    router.stop()  # gone: connection refused
    with client.messages.stream(
        model=MODEL,
        max_tokens=48,
        extra_body=GREEDY,
        tools=[TOOL],
        tool_choice=FORCED,
        messages=[{"role": "user", "content": QUESTION}],
    ) as stream:
        streamed = stream.get_final_message()
    for reply in (msg, streamed):
        assert len(reply.content) >= 2, reply
        call, result = reply.content[0], reply.content[1]
        assert call.type == "server_tool_use" and result.tool_use_id == call.id
        assert result.content.type == "web_search_tool_result_error" and result.content.error_code == "unavailable"
        assert reply.usage.server_tool_use.web_search_requests == 0
    assert metric(server.base_url, 'sluice_search_tool_calls_total{result="unavailable"}') == 2
    assert metric(server.base_url, 'sluice_search_tool_calls_total{result="ok"}') >= 3  # the earlier tests'
    fleet.write_text(_fleet(None))
    assert admin(server, "POST", "/admin/fleet/reload").status_code == 200
    with pytest.raises(anthropic.BadRequestError) as exc:
        _ask(client)
    assert "search service" in exc.value.message and "[search]" in exc.value.message
    r = httpx.post(
        server.base_url + "/v1/messages",
        json={"model": MODEL, "max_tokens": 4, "tools": [TOOL], "messages": [{"role": "user", "content": "hi"}]},
        timeout=60,
    )
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
