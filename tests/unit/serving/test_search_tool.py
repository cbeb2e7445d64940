"""The search tool's serving side without servers: a hit as the model reads it, every answer of
the search service mapped to results or an error code (httpx's mock transport), and the rounds
loop (fake rounds, a fake search) — continuing, bounds, pause, budget, usage."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from sluice.gateway.principal import Principal
from sluice.routing.fleet_file.search_service import SearchServiceSpec
from sluice.serving.errors import ErrorKind, ServingError
from sluice.serving.outcomes import Failed, Finished, ServerToolResult, TextDelta, ToolCallDone, ToolCallStarted
from sluice.serving.output_budget import OutputBudget
from sluice.serving.prompt import Conversation, Turn
from sluice.serving.request import Route, ServingRequest
from sluice.serving.search_tool import tool_loop
from sluice.serving.search_tool.domains import DomainRules
from sluice.serving.search_tool.search_client import hit_result, search
from sluice.serving.search_tool.search_error import SearchToolError
from sluice.serving.search_tool.tool_loop import SearchRounds, attached_service, continued
from sluice.tool_types import Role, SearchResult, SearchToolUse, ToolCall, ToolChoice, ToolChoiceMode, ToolResult
from sluice.types import FinishReason, Usage

SERVICE = SearchServiceSpec(url="http://search.invalid:8500/", max_uses=3, max_result_chars=100)


def test_a_hit_reads_as_title_source_age_and_its_snippet_never_the_whole_text():
    hit = {
        "id": "d1",
        "score": 1.0,
        "fields": {"title": "T", "body": "b" * 300 + " secret", "tags": "x"},
        "snippet": "a <b>Match</b> &amp; &lt;more&gt; " + "b" * 300,
    }
    r = hit_result(hit, 100)
    assert r == SearchResult("sluice-search:d1", "T", ("a Match & <more> " + "b" * 300)[:100])
    assert "secret" not in r.render()  # the stored text beyond the snippet never reaches the model
    r = hit_result(
        {
            "id": "d2",
            "fields": {"url": "https://e.org/2", "body": "text", "page_age": "May 2, 2025"},
            "snippet": "text",
        },
        100,
    )
    assert r == SearchResult("https://e.org/2", "d2", "text", "May 2, 2025")
    assert r.render() == "d2\nhttps://e.org/2\npage age: May 2, 2025\ntext"
    assert SERVICE.url == "http://search.invalid:8500"  # the trailing slash is dropped once, here


def _answer(status: int, body: object = None, exc: Exception | None = None, seen: list | None = None):
    def handle(request: httpx.Request) -> httpx.Response:
        if seen is not None:
            seen.append(request)
        if exc is not None:
            raise exc
        return httpx.Response(status, json=body) if body is not None else httpx.Response(status, text="oops")

    return httpx.MockTransport(handle)


@pytest.mark.parametrize(
    "status,body,code",
    [
        (
            400,
            {"error": {"type": "query_syntax_error", "message": "unterminated quote at position 3"}},
            SearchToolError.INVALID_INPUT,
        ),
        (
            400,
            {"error": {"type": "invalid_request_error", "message": "a query has at most 64 words"}},
            SearchToolError.QUERY_TOO_LONG,
        ),
        (429, {"error": {}}, SearchToolError.TOO_MANY_REQUESTS),
        (401, {"error": {}}, SearchToolError.UNAVAILABLE),
        (503, None, SearchToolError.UNAVAILABLE),
        (200, {"no": "hits"}, SearchToolError.UNAVAILABLE),
    ],
)
def test_every_refusal_is_an_error_code(status, body, code):
    assert asyncio.run(search(SERVICE, "q", _answer(status, body))) is code


def test_timeouts_and_transport_errors_are_unavailable():
    for exc in (httpx.ReadTimeout("slow"), httpx.ConnectError("refused")):
        assert asyncio.run(search(SERVICE, "q", _answer(0, exc=exc))) is SearchToolError.UNAVAILABLE


def test_the_fleets_key_and_top_k_are_sent(monkeypatch):
    monkeypatch.setenv("FLEET_SEARCH_KEY", "fleet-key")
    service = SearchServiceSpec(url="http://s:1", api_key_env="FLEET_SEARCH_KEY", top_k=2)
    seen: list[httpx.Request] = []
    found = asyncio.run(
        search(service, "paris", _answer(200, {"hits": [{"id": "a", "fields": {"title": "A"}}]}, seen=seen))
    )
    assert found == [SearchResult("sluice-search:a", "A", "")]
    assert str(seen[0].url) == "http://s:1/v1/search" and json.loads(seen[0].content) == {
        "query": "paris",
        "top_k": 2,
        "snippet_chars": 500,
        "mode": "hybrid",
        "hybrid": {"fusion": "weighted", "dense_weight": 0.3, "window": 50},
    }
    assert seen[0].headers["authorization"] == "Bearer fleet-key"


def test_domain_rules_filter_in_the_service_and_again_on_every_hit():
    """The service is asked to filter by domain; a hit from a blocked domain that it answers
    anyway (an older service, a bug) is still never returned."""
    rules = DomainRules.parse(None, ["blocked.org", "example.com/private"])
    seen: list[httpx.Request] = []
    hits = [
        {"id": "a", "fields": {"url": "https://blocked.org/x"}, "snippet": "a"},
        {"id": "b", "fields": {"url": "https://sub.blocked.org/x"}, "snippet": "b"},
        {"id": "c", "fields": {"url": "https://example.com/private/x"}, "snippet": "c"},
        {"id": "d", "fields": {"url": "https://example.com/public"}, "snippet": "d"},
        {"id": "e", "fields": {}, "snippet": "e"},
    ]
    found = asyncio.run(search(SERVICE, "q", _answer(200, {"hits": hits}, seen=seen), rules=rules))
    assert [r.title for r in found] == ["d", "e"]
    body = json.loads(seen[0].content)
    assert body["filter"] == {"url.domain": {"not_in": ["blocked.org"]}} and body["top_k"] == 20  # paths: 4x
    allowed = DomainRules.parse(["docs.example.com"], None)
    found = asyncio.run(
        search(
            SERVICE,
            "q",
            _answer(200, {"hits": hits + [{"id": "f", "fields": {"url": "https://docs.example.com/g"}}]}, seen=seen),
            rules=allowed,
        )
    )
    assert [r.title for r in found] == ["f"]  # no url: no domain, not allowed
    assert json.loads(seen[1].content)["filter"] == {"url.domain": {"in": ["docs.example.com"]}}


def _request(max_tokens: int | None = 100, max_uses: int | None = None) -> ServingRequest:
    conv = Conversation([Turn(Role.USER, ["q?"])], prefill="So")
    return ServingRequest(
        "msg_1",
        Route.MESSAGES,
        Principal("t"),
        "m",
        conv,
        OutputBudget(max_tokens),
        tool_choice=ToolChoice(ToolChoiceMode.TOOL, "web_search"),
        search_tool=SearchToolUse("web_search", max_uses),
    )


def _round(*calls: str, text: str = "", out: int = 10, client: int = 0, reason: FinishReason = FinishReason.EOS):
    async def gen():
        usage = Usage(20, out, 5)
        if text:
            yield TextDelta(text, usage)
        for i, q in enumerate(calls):
            yield ToolCallStarted(i, f"srvtoolu_{q}", "web_search", usage, True)
            yield ToolCallDone(
                i, f"srvtoolu_{q}", "web_search", {"query": q}, json.dumps({"query": q}), True, usage, True
            )
        for j in range(client):
            yield ToolCallDone(len(calls) + j, f"toolu_{j}", "get", {}, "{}", True, usage)
        yield Finished(reason, usage=usage, tool_calls=len(calls) + client)

    return gen()


COUNTED: list[str] = []  # the metric's labels, per call, of the latest _run
LEFT: list[int | None] = []  # each next round's budget as it started (the rounds share one budget)


def _run(req: ServingRequest, rounds: list, monkeypatch, fail_search: bool = False):
    COUNTED.clear()
    LEFT.clear()
    queries: list[str] = []
    started: list[ServingRequest] = []
    ended: list[bool] = []

    async def fake_search(service, query, **kw):
        queries.append(query)
        return SearchToolError.UNAVAILABLE if fail_search else [SearchResult("s", query.upper(), "text")]

    async def next_round(r: ServingRequest):
        started.append(r)
        LEFT.append(r.budget.left)
        nxt = rounds.pop(0)
        if isinstance(nxt, Exception):
            raise nxt
        return nxt(r) if callable(nxt) else nxt

    async def end_first():
        ended.append(True)

    async def collect():
        return [
            o async for o in SearchRounds(req, SERVICE, next_round, end_first, COUNTED.append).outcomes(rounds.pop(0))
        ]

    monkeypatch.setattr(tool_loop, "search", fake_search)
    return asyncio.run(collect()), queries, started, ended


def test_a_search_round_feeds_the_next_and_usage_adds_up(monkeypatch):
    out, queries, started, ended = _run(
        _request(), [_round("paris", text="Let me look."), _round(text="Mild.")], monkeypatch
    )
    results = [o for o in out if isinstance(o, ServerToolResult)]
    assert queries == ["paris"] and results[0].results[0].title == "PARIS" and ended == [True]
    final = out[-1]
    assert isinstance(final, Finished) and not final.called_tools and final.server_tool_uses == 1
    assert final.usage == Usage(40, 20, 10)
    nxt = started[0]
    assert nxt.request_id == "msg_1-1" and nxt.tool_choice.mode is ToolChoiceMode.AUTO and LEFT == [90]
    assert nxt.dedup_body is None and not nxt.use_cache
    turns = nxt.conversation.turns
    assert turns[1].role is Role.ASSISTANT and turns[1].parts[0] == "SoLet me look."
    assert turns[1].parts[1] == ToolCall("srvtoolu_paris", "web_search", {"query": "paris"})
    assert turns[2].role is Role.USER and turns[2].parts == [ToolResult("srvtoolu_paris", "PARIS\ns\ntext")]
    assert nxt.conversation.prefill == ""


def test_searches_are_bounded_by_max_uses_and_rounds_end_paused(monkeypatch):
    out, queries, started, _ = _run(_request(max_uses=1), [_round("a", "b"), _round("c")], monkeypatch)
    results = [o for o in out if isinstance(o, ServerToolResult)]
    assert queries == ["a"]  # b and c: past max_uses, no search
    assert [r.error for r in results] == [None, SearchToolError.MAX_USES_EXCEEDED, SearchToolError.MAX_USES_EXCEEDED]
    final = out[-1]
    assert len(started) == 1 and isinstance(final, Finished) and final.paused and final.server_tool_uses == 1
    assert COUNTED == ["ok", "max_uses_exceeded", "max_uses_exceeded"]


def test_the_fleet_caps_a_requests_max_uses(monkeypatch):
    rounds = [_round(str(i)) for i in range(10)]
    out, queries, started, _ = _run(_request(max_uses=50), rounds, monkeypatch)
    assert len(queries) == SERVICE.max_uses and len(started) == SERVICE.max_uses and out[-1].paused
    assert LEFT == [90, 80, 70] and {id(s.budget) for s in started} == {
        id(started[0].budget)
    }  # one budget for the reply


def test_a_client_call_hands_the_turn_back(monkeypatch):
    out, queries, started, _ = _run(_request(), [_round("a", client=1)], monkeypatch)
    final = out[-1]
    assert queries == ["a"] and not started and final.called_tools and final.tool_calls == 1 and not final.paused


def test_the_token_budget_spans_rounds(monkeypatch):
    out, _, started, _ = _run(_request(max_tokens=10), [_round("a", out=10)], monkeypatch)
    assert not started and out[-1].reason is FinishReason.LENGTH and not out[-1].paused


def _honest_round(want: int):
    """A round that searches and generates `want` tokens, or as many as its request's budget
    leaves (then it is cut: LENGTH), as the engine would."""

    def start(r: ServingRequest):
        left = r.budget.left
        out = want if left is None else min(want, left)
        return _round("more", out=out, reason=FinishReason.EOS if out == want else FinishReason.LENGTH)

    return start


@pytest.mark.parametrize("max_tokens", [1, 7, 10, 25, 29, 30, 31, 100])
def test_the_rounds_never_spend_more_than_max_tokens_and_usage_is_exact(monkeypatch, max_tokens):
    """Whatever max_tokens is, the rounds' outputs add up to at most it, each round starts with
    exactly what the earlier ones left, and the final usage counts every round's tokens."""
    first = _honest_round(10)(_request(max_tokens))
    out, _, started, _ = _run(
        _request(max_tokens, max_uses=3), [first, *(_honest_round(10) for _ in range(3))], monkeypatch
    )
    final = out[-1]
    rounds = 1 + len(started)
    spent = min(max_tokens, 10 * rounds)
    assert final.usage == Usage(20 * rounds, spent, 5 * rounds) and spent <= max_tokens
    assert LEFT == [max_tokens - 10 * i for i in range(1, rounds)]
    assert final.reason is (FinishReason.LENGTH if max_tokens <= 10 * rounds else FinishReason.EOS)


def test_a_round_cut_after_its_call_still_answers_it(monkeypatch):
    out, queries, started, _ = _run(_request(), [_round("a", reason=FinishReason.STOP_SEQUENCE)], monkeypatch)
    assert queries == ["a"] and not started and isinstance(out[-2], ServerToolResult)
    assert out[-1].reason is FinishReason.STOP_SEQUENCE and out[-1].server_tool_uses == 1 and not out[-1].called_tools


def test_failed_searches_are_results_and_not_counted(monkeypatch):
    out, _, _, _ = _run(_request(), [_round("a"), _round(text="sorry")], monkeypatch, fail_search=True)
    assert [o.error for o in out if isinstance(o, ServerToolResult)] == [SearchToolError.UNAVAILABLE]
    assert out[-1].server_tool_uses == 0


def test_a_refused_next_round_is_a_failure_with_the_usage_so_far(monkeypatch):
    refusal = ServingError(ErrorKind.RATE_LIMITED, "slow down", retry_after_s=3)
    out, _, _, _ = _run(_request(), [_round("a"), refusal], monkeypatch)
    assert isinstance(out[-1], Failed) and out[-1].kind is ErrorKind.RATE_LIMITED and out[-1].usage == Usage(20, 10, 5)


def test_no_service_is_a_400_naming_it():
    with pytest.raises(ServingError) as exc:
        attached_service(None, _request())
    assert exc.value.kind is ErrorKind.INVALID_REQUEST and "[search]" in exc.value.message
    assert attached_service(SERVICE, _request()) is SERVICE
    assert (
        attached_service(
            None, ServingRequest("x", Route.MESSAGES, Principal("t"), "m", Conversation([]), OutputBudget(1))
        )
        is None
    )


def test_continued_keeps_text_and_drops_cut_calls():
    conv = Conversation([Turn(Role.USER, ["q"])])
    cut = ToolCallDone(1, "srvtoolu_b", "web_search", {}, "", False, Usage(), True)
    done = ToolCallDone(0, "srvtoolu_a", "web_search", {"query": "a"}, "", True, Usage(), True)
    res = ServerToolResult("srvtoolu_a", error=SearchToolError.UNAVAILABLE)
    turns = continued(conv, ["x", "y", done, cut], [res]).turns
    assert turns[1].parts == ["xy", ToolCall("srvtoolu_a", "web_search", {"query": "a"})]
    assert turns[2].parts == [ToolResult("srvtoolu_a", "search error: unavailable", is_error=True)]
