"""The one path every request takes, whatever its wire format: the serving pipeline.

    gen = await pipeline.start(request, wait_s, disconnected)   # refusals raise ServingError
    async for outcome in gen.outcomes(): ...                    # TextDelta… then a final outcome
    result = await gen.collect()                                # or: the whole reply at once

`start` does everything that can refuse a request before a response starts, in this order:
a worker ready → the plan (model known, pinned version allowed, fallback, the tenant's model
quota: serving/planning.py) with the prompt rendered in that version's tokens (off the event
loop) and checked against its context window and what the worker protocol can carry → L1 input
rules → gateway admission (rate limits 429, a full queue 529). With
`wait_s` set (streams), `start` also waits for the first outcome (serving/stages/lookahead.py): the
engine refusing at once — its worker just died, none left to take the request — is a refusal
too (529), not a stream that opens and fails. A request still queued, or whose first output is
not ready, after `wait_s` (the rate limits having decided: only the queue and the engine may
keep a stream waiting) is handed back anyway, so its stream can open and ping while it waits;
a failure that comes later is then a `Failed` outcome.

`outcomes()` is a chain of async generators — gateway session → engine generate → safety guard
(L2–L4) → deadline — each opened with `contextlib.aclosing`, so closing the outermost one
(a disconnect, a send timeout, a refusal, a finished stream) closes every stage below it at once,
and the engine request is aborted in that one motion. The session's lease and rate-limit
settlement are released in one place, `Generation.close()`, however the stream ended.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import aclosing
from dataclasses import dataclass, field

from anyio import CancelScope

from sluice.gateway.gateway import Session
from sluice.gateway.rate_limit_headers import rate_limit_headers
from sluice.models.tokenizer import Tokenizer
from sluice.models.tools.format import ToolFormat
from sluice.routing.dispatch.router import RoutePlan
from sluice.routing.fleet_file.search_service import SearchServiceSpec
from sluice.safety.pipeline import SafetyPipeline
from sluice.safety.verdict import Verdict
from sluice.serving.admission import Disconnected, open_session, until_admitted
from sluice.serving.errors import ErrorKind, ServingError
from sluice.serving.generation import generate
from sluice.serving.guided import parses_calls, resolve_tool_format
from sluice.serving.outcomes import (
    Failed,
    Final,
    Finished,
    Outcome,
    ServerToolResult,
    TextDelta,
    ToolCallDone,
    ToolPiece,
)
from sluice.serving.planning import Planner
from sluice.serving.prompt import BuiltPrompt, Conversation, build_prompt
from sluice.serving.request import FALLBACK_HEADER, QUOTA_WARNING_HEADER, VERSION_HEADER, ServingRequest
from sluice.serving.runtime import ServingRuntime
from sluice.serving.safety_check import check_input
from sluice.serving.search_tool.tool_loop import SearchRounds, attached_service
from sluice.serving.stages.deadline import with_deadline
from sluice.serving.stages.guarded_stream import guarded
from sluice.serving.stages.lookahead import Lookahead
from sluice.serving.stages.tool_stream import with_tool_calls
from sluice.types import GenerationRequest, TokenLogprob

L2_INPUT_CHARS = 4000  # the classifier reads the end of the conversation
NOT_FINAL = TextDelta | ToolPiece  # built once: `|` makes a new union at every evaluation


@dataclass(slots=True)
class Prepared:
    """A request that passed every check before admission, planned onto a model version."""

    request: ServingRequest
    planner: Planner
    plan: RoutePlan
    generation: GenerationRequest
    prompt: BuiltPrompt
    safety: SafetyPipeline | None
    input_text: str  # what L2 classifies
    search_service: SearchServiceSpec | None = None  # where the search server tool's calls run

    @property
    def tool_format(self) -> ToolFormat | None:
        """The format tool calls are parsed in, when the reply may hold calls."""
        if not parses_calls(self.generation.sampling.guided):
            return None
        return resolve_tool_format(self.planner.fleet.settings.tool_format)

    @property
    def tokenizer(self) -> Tokenizer:
        """The serving version's tokenizer (token text for logprobs)."""
        plan = self.planner.current or self.plan
        return self.planner.fleet.version(plan.model_id, plan.version).tokenizer

    @property
    def headers(self) -> dict[str, str]:
        """Which version serves the request, and whether a fallback does (docs/FLEET.md): the
        latest plan, so a reply sent after a retry moved to another version names that one (a
        stream's headers go out when it opens, before any retry)."""
        plan = self.planner.current or self.plan
        out = {VERSION_HEADER: plan.version_header}
        if plan.fallback_from is not None:
            out[FALLBACK_HEADER] = plan.fallback_from
        if plan.soft_exceeded:
            out[QUOTA_WARNING_HEADER] = ", ".join(plan.soft_exceeded)
        return out


@dataclass(slots=True)
class Collected:
    text: str  # the reply's text blocks, joined
    final: Final
    # the reply in order: text blocks, tool calls (a call cut short by max_tokens included) and
    # the search server tool's results
    blocks: list[str | ToolCallDone | ServerToolResult] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)  # when asked: one per output token
    prompt_logprobs: list[TokenLogprob | None] | None = None  # when asked: one per prompt token


class ServingPipeline:
    def __init__(self, rt: ServingRuntime):
        self.rt = rt

    def tokenizer_of(self, model: str) -> tuple[Tokenizer, int]:
        """The tokenizer and context window of the model's version that takes the most of its
        live traffic (what /tokenize and /detokenize use): Fleet.leading_version."""
        fleet = self.rt.require_fleet()
        model_id = self.rt.check_model(model)
        version = fleet.leading_version(model_id)
        return fleet.version(model_id, version).tokenizer, fleet.max_model_len(model_id, version)

    async def count_tokens(self, model: str, conversation: Conversation) -> int:
        """The exact prompt length a generation request with this conversation would use (with
        the tokenizer of tokenizer_of's version)."""
        tokenizer, _ = self.tokenizer_of(model)
        fmt = resolve_tool_format(self.rt.settings.tool_format)
        prompt = await asyncio.to_thread(build_prompt, conversation, tokenizer, fmt)
        return len(prompt.token_ids)

    async def prepare(self, req: ServingRequest) -> Prepared:
        rt = self.rt
        fleet = rt.require_ready()
        service = attached_service(fleet.registry.fleet.search, req)  # read once: a reload mid-request changes nothing
        planner = Planner(fleet, req)
        plan, priced = await planner.plan()  # model, version, quota; the prompt in its tokens
        try:
            texts = req.conversation.safety_texts()
            if isinstance(req.raw_prompt, list):  # token ids: the rules read their text
                texts = [fleet.version(plan.model_id, plan.version).tokenizer.decode(req.raw_prompt)]
            safety = check_input(rt, req.principal, texts, req.request_id)
        except BaseException:
            await fleet.router.settle(plan, 0)  # the quota reservation goes back
            raise
        return Prepared(
            req, planner, plan, priced.generation, priced.prompt, safety, "\n".join(texts)[-L2_INPUT_CHARS:], service
        )

    async def start(
        self, req: ServingRequest, wait_s: float | None = None, disconnected: Disconnected | None = None
    ) -> Generation:
        """Prepare and admit. `wait_s`: how long to wait for admission before handing the
        generation back still queued (None: until admitted or refused)."""
        prepared = await self.prepare(req)
        return await self.open(prepared, wait_s, disconnected)

    async def open(
        self, prepared: Prepared, wait_s: float | None = None, disconnected: Disconnected | None = None
    ) -> Generation:
        rt, req, gen = self.rt, prepared.request, prepared.generation
        loop = asyncio.get_running_loop()
        began = loop.time()
        limited = asyncio.Event()  # the rate limits have decided: only the queue is left
        opening = asyncio.ensure_future(
            open_session(
                rt,
                req,
                prepared.plan.version_header,
                gen,
                lambda: generate(rt, prepared.planner, prepared.plan, gen, req.route.value, req.principal.tier),
                limited,
            )
        )
        try:
            admitted = await until_admitted(opening, disconnected, wait_s, limited)
            if admitted:
                opening.result()  # a refusal known in time raises here: a real 429 / 529 status
        except BaseException:  # refused, the caller left (ClientGone) or was cancelled: leave the queue now
            opening.cancel()
            with CancelScope(shield=True):
                await asyncio.wait({opening})  # its clean-up (the queue entry, the lease) has run
                await prepared.planner.fleet.router.settle(prepared.plan, 0)  # and the quota reservation
            raise
        generation = Generation(rt, prepared, opening)
        if admitted and wait_s is not None:
            # a stream: open it once the engine has answered (its first outcome) or the wait is
            # over, so a worker that is gone — and no other to take the request — is a 529 too
            try:
                await generation.first_outcome(disconnected, max(0.0, began + wait_s - loop.time()))
            except BaseException:
                await generation.close()
                raise
        return generation


class Generation:
    """One admitted (or still queued) request: its outcomes, once; `close()` always (idempotent)."""

    def __init__(self, rt: ServingRuntime, prepared: Prepared, opening: asyncio.Future[Session]):
        self.rt = rt
        self.prepared = prepared
        self._opening = opening
        self._closed = False
        self._outcomes = Lookahead(self._produce())

    @property
    def request_id(self) -> str:
        return self.prepared.request.request_id

    @property
    def headers(self) -> dict[str, str]:
        """The model version headers, and the rate-limit headers once admitted (none while
        still queued)."""
        out = self.prepared.headers
        if self._opening.done() and not self._opening.cancelled() and self._opening.exception() is None:
            out.update(rate_limit_headers(self._opening.result().decision))
        return out

    async def first_outcome(self, disconnected: Disconnected | None, wait_s: float) -> None:
        """Fetch the first outcome ahead, waiting at most `wait_s`: a failure known by then —
        the engine gone and no other worker to take the request, the engine's own refusal — is
        raised as the refusal it is (a real 429 / 529 status the SDKs retry)."""
        first = self._outcomes.fetch_first()
        if not await until_admitted(first, disconnected, wait_s):
            return  # still waiting: the response opens, pings flow, a failure later is an error event
        outcome = first.result()
        if isinstance(outcome, Failed):
            raise outcome.as_error()

    async def outcomes(self) -> AsyncGenerator[Outcome, None]:
        try:
            async with aclosing(self._outcomes.items()) as outcomes:
                async for outcome in outcomes:
                    yield outcome
        finally:
            await self.close()

    async def _produce(self) -> AsyncGenerator[Outcome, None]:
        try:
            session = await self._opening  # admitted already, or still queued
        except ServingError as exc:  # refused after the caller stopped waiting (a deadline)
            yield Failed(exc.kind, exc.message, retry_after_s=exc.retry_after_s)
            return
        p = self.prepared
        stream = with_deadline(
            self.rt, guarded(p.safety, session.events(), p.input_text, self.request_id, self._count_verdict)
        )
        fmt = p.tool_format
        if fmt is not None:  # after the guard: safety reads the calls as the model wrote them
            stream = with_tool_calls(stream, fmt, p.request.tool_id_prefix, p.request.server_tool_names)
        if p.search_service is not None:  # the search tool's calls run here, then the next round generates
            rounds = SearchRounds(
                p.request,
                p.search_service,
                self._next_round,
                session.close,
                lambda result: self.rt.metrics.search_tool_calls.labels(result).inc(),
            )
            stream = rounds.outcomes(stream)
        try:
            async with aclosing(stream) as outcomes:
                async for outcome in outcomes:
                    yield outcome
                    if not isinstance(outcome, NOT_FINAL):
                        return
        except ServingError as exc:  # the engine went away or refused mid-way
            yield Failed(exc.kind, exc.message, retry_after_s=exc.retry_after_s)
            return
        yield Failed(ErrorKind.INTERNAL, "the generation ended without a final event")

    async def _next_round(self, req: ServingRequest) -> AsyncIterator[Outcome]:
        """A search tool round after the first: a request of its own through the whole pipeline."""
        return (await ServingPipeline(self.rt).start(req)).outcomes()

    async def collect(self) -> Collected:
        """The whole reply, bounded by `request_timeout_s` (TIMEOUT past it)."""
        parts: list[str] = []
        blocks: list[str | ToolCallDone | ServerToolResult] = []
        final: Final | None = None
        logprobs: list[TokenLogprob] = []
        prompt_logprobs: list[TokenLogprob | None] | None = None

        async def run() -> None:
            nonlocal final, prompt_logprobs
            async with aclosing(self.outcomes()) as outcomes:
                async for outcome in outcomes:
                    if isinstance(outcome, (TextDelta, Finished)):
                        logprobs.extend(outcome.logprobs)
                        prompt_logprobs = prompt_logprobs or outcome.prompt_logprobs
                    if isinstance(outcome, TextDelta):
                        parts.append(outcome.text)
                        if blocks and isinstance(blocks[-1], str):
                            blocks[-1] += outcome.text
                        else:
                            blocks.append(outcome.text)
                    elif isinstance(outcome, (ToolCallDone, ServerToolResult)):
                        blocks.append(outcome)
                    elif not isinstance(outcome, ToolPiece):
                        final = outcome

        try:
            await asyncio.wait_for(run(), self.rt.settings.request_timeout_s)
        except TimeoutError:
            raise ServingError(ErrorKind.TIMEOUT, "the request took longer than the server's request timeout") from None
        finally:
            await self.close()
        assert final is not None  # outcomes() always ends with one
        return Collected("".join(parts), final, blocks, logprobs, prompt_logprobs)

    async def close(self) -> None:
        """Leave the queue, or return the admission lease and settle the rate limits."""
        if self._closed:
            return
        self._closed = True
        # shielded: a disconnect cancels the response's scope, and anyio cancellation is
        # level-triggered — every await here would be cancelled and the settlement lost
        with CancelScope(shield=True):
            await self._outcomes.aclose()  # a first outcome fetched ahead is cancelled, the engine request aborted
            if not self._opening.done():
                self._opening.cancel()
            elif not self._opening.cancelled() and self._opening.exception() is None:
                await self._opening.result().close()

    def _count_verdict(self, v: Verdict) -> None:
        self.rt.metrics.safety_verdicts.labels(v.layer.value, v.category).inc()
