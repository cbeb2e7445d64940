"""The search server tool's rounds: generate, run the searches the reply called, generate on.

A round is one generation. When it ends with calls of the search tool (and nothing else: a
client tool's call hands the turn back to the client), the gateway runs each search
(search_client.py), yields its result, adds the round's reply and the results to the
conversation (an assistant turn with the calls, then a user turn with one tool result of
search results per call: what a client would have sent) and starts the next round as a new
request through the pipeline (admission, rate limits and safety checks included, so a search
result is checked as input like any tool result). The renderer sees one reply: every round's
text and calls, each search's result after its call, one final outcome.

Bounds, so nothing loops: at most `max_uses` searches (the request's, never above the fleet's
`search.max_uses`; a call past it gets a `max_uses_exceeded` result without a search) and
`max_uses + 1` rounds; a reply still searching after the last round ends `paused` (Anthropic's
`pause_turn`: the client sends it back to continue). `max_tokens` bounds the output of all
rounds together: every round's request carries the reply's one OutputBudget
(serving/output_budget.py), which planning sizes each round by and the loop spends each round's
output on. `tool_choice` applies to the first round; later rounds are `auto` (a forced
call would force a search every round). The final usage is every round's summed, with the
searches the service answered counted in `server_tool_uses`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from contextlib import aclosing

from sluice.routing.fleet_file.search_service import SearchServiceSpec
from sluice.serving.errors import ErrorKind, ServingError, invalid
from sluice.serving.outcomes import Failed, Final, Finished, Outcome, Refused, ServerToolResult, TextDelta, ToolCallDone
from sluice.serving.prompt import Conversation, Turn
from sluice.serving.request import ServingRequest
from sluice.serving.search_tool.domains import DomainRules
from sluice.serving.search_tool.search_client import search
from sluice.serving.search_tool.search_error import SearchToolError
from sluice.tool_types import Part, Role, ToolCall, ToolChoice, ToolChoiceMode, search_tool_result
from sluice.types import FinishReason, Usage

NextRound = Callable[[ServingRequest], Awaitable[AsyncIterator[Outcome]]]
Count = Callable[[str], None]  # one call's result: "ok" or its error code (the metric's label)


def attached_service(service: SearchServiceSpec | None, req: ServingRequest) -> SearchServiceSpec | None:
    """The service a request's search tool runs against (None: it declares none); a request
    declaring the tool on a fleet without a search service is a 400 naming the problem."""
    if req.search_tool is None:
        return None
    if service is None:
        raise invalid(
            f"tools: the server tool {req.search_tool.name!r} needs a search service, and this server's "
            "fleet has none attached (the fleet file's [search] table)",
            param="tools",
        )
    return service


def _plus(a: Usage, b: Usage) -> Usage:
    return Usage(
        a.prompt_tokens + b.prompt_tokens, a.output_tokens + b.output_tokens, a.cached_tokens + b.cached_tokens
    )


def _with_usage(final: Final, spent: Usage, searches: int) -> Final:
    final.usage = _plus(spent, final.usage)
    if isinstance(final, Finished):
        final.server_tool_uses = searches
    return final


def continued(conv: Conversation, reply: list[str | ToolCallDone], results: list[ServerToolResult]) -> Conversation:
    """The conversation with a round's reply (text and calls, the prefill it continued in front)
    and the searches' results as the next user turn; the next round starts a new reply."""
    parts: list[Part] = [conv.prefill] if conv.prefill else []
    for p in reply:
        if isinstance(p, str):
            if parts and isinstance(parts[-1], str):
                parts[-1] += p
            elif p:
                parts.append(p)
        elif p.complete:
            parts.append(ToolCall(p.id, p.name, p.input))
    answers: list[Part] = [
        search_tool_result(r.tool_use_id, r.results, r.error.value if r.error else None) for r in results
    ]
    turns = [*conv.turns, Turn(Role.ASSISTANT, parts), Turn(Role.USER, answers)]
    return dataclasses.replace(conv, turns=turns, prefill="")


class SearchRounds:
    def __init__(
        self,
        req: ServingRequest,
        service: SearchServiceSpec,
        next_round: NextRound,
        end_first_round: Callable[[], Awaitable[None]],
        count: Count = lambda result: None,
    ):
        assert req.search_tool is not None
        self.req, self.service = req, service
        self.next_round, self.end_first_round, self.count = next_round, end_first_round, count
        self.max_uses = min(req.search_tool.max_uses or service.max_uses, service.max_uses)
        self.rules = DomainRules.parse(req.search_tool.allowed_domains, req.search_tool.blocked_domains)
        self.uses = 0  # searches run (a call past max_uses runs none)
        self.answered = 0  # searches the service answered: usage.server_tool_use
        self.spent = Usage()  # the finished rounds' usage

    async def _run(self, call: ToolCallDone, usage: Usage) -> ServerToolResult:
        result = await self._search(call, usage)
        self.count(result.error.value if result.error is not None else "ok")
        return result

    async def _search(self, call: ToolCallDone, usage: Usage) -> ServerToolResult:
        if self.uses >= self.max_uses:
            return ServerToolResult(call.id, error=SearchToolError.MAX_USES_EXCEEDED, usage=usage)
        self.uses += 1
        found = await search(self.service, str(call.input.get("query", "")), rules=self.rules)
        if isinstance(found, SearchToolError):
            return ServerToolResult(call.id, error=found, usage=usage)
        self.answered += 1
        return ServerToolResult(call.id, found, usage=usage)

    async def outcomes(self, first: AsyncIterator[Outcome]) -> AsyncGenerator[Outcome, None]:
        req, stream = self.req, first
        for round_no in range(self.max_uses + 1):
            reply: list[str | ToolCallDone] = []
            final: Final | None = None
            async with aclosing(stream) as round_outcomes:  # type: ignore[type-var]
                async for outcome in round_outcomes:
                    if isinstance(outcome, (Finished, Refused, Failed)):
                        final = outcome
                        break
                    if isinstance(outcome, TextDelta):
                        reply.append(outcome.text)
                    elif isinstance(outcome, ToolCallDone):
                        reply.append(outcome)
                    yield outcome
            if final is None:
                final = Failed(ErrorKind.INTERNAL, "a search tool round ended without a final event")
            server = [c for c in reply if isinstance(c, ToolCallDone) and c.complete and c.server]
            if not isinstance(final, Finished) or not server:
                yield _with_usage(final, self.spent, self.answered)
                return
            if round_no == 0:
                await self.end_first_round()  # its admission lease and rate-limit settlement: not held while searching
            results = [await self._run(call, final.usage) for call in server]
            for result in results:
                yield result
            client_calls = final.tool_calls - len(server)
            if not final.called_tools:  # cut after its calls (max_tokens, a stop sequence): every call has its result
                final.tool_calls = client_calls
                yield _with_usage(final, self.spent, self.answered)
                return
            self.spent = _plus(self.spent, final.usage)
            req.budget.spend(final.usage.output_tokens)  # the next round gets what is left
            out_of_tokens = req.budget.exhausted
            if client_calls or out_of_tokens or round_no == self.max_uses:
                reason = FinishReason.LENGTH if out_of_tokens and not client_calls else FinishReason.EOS
                yield Finished(
                    reason,
                    usage=self.spent,
                    tool_calls=client_calls,
                    server_tool_uses=self.answered,
                    paused=not client_calls and not out_of_tokens,
                )
                return
            choice = ToolChoice(ToolChoiceMode.AUTO, None, req.tool_choice.disable_parallel)
            req = dataclasses.replace(
                req,
                request_id=f"{self.req.request_id}-{round_no + 1}",
                conversation=continued(req.conversation, reply, results),
                tool_choice=choice,
                dedup_body=None,
                use_cache=False,
                queue_timeout_s=None,
            )
            try:
                stream = await self.next_round(req)
            except ServingError as exc:  # the next round refused (a rate limit, the queue, the context window)
                yield Failed(exc.kind, exc.message, self.spent, exc.retry_after_s)
                return
