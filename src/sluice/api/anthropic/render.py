"""Pipeline outcomes → Anthropic's wire objects: the Message, the SSE event sequence, usage.

A renderer turns outcomes into its format and nothing else: what can refuse a request, when a
stream ends, what a failure means — all of that was decided by the pipeline.
"""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any

from sluice.api.anthropic.search_blocks import result_block
from sluice.api.errors import anthropic_error_type
from sluice.serving.errors import ServingError
from sluice.serving.outcomes import (
    Failed,
    Finished,
    Refused,
    ServerToolResult,
    TextDelta,
    ToolCallDone,
    ToolCallStarted,
    ToolInputDelta,
)
from sluice.serving.pipeline import Collected, Generation
from sluice.streaming.replay_log import ReplayEvent
from sluice.types import FinishReason, Usage

STOP_REASONS = {
    FinishReason.EOS: "end_turn",
    FinishReason.LENGTH: "max_tokens",
    FinishReason.STOP_SEQUENCE: "stop_sequence",
    FinishReason.CONTEXT: "model_context_window_exceeded",
}
PING = ReplayEvent(0, "ping", '{"type":"ping"}')  # seq 0: not part of the replayable content


@dataclass(slots=True)
class UsagePlan:
    """How engine usage maps to Anthropic's prompt-cache accounting (reference §9.3).

    Prefix-cache hits are reported as `cache_read_input_tokens` (with or without markers).
    With a `cache_control` breakpoint, the full KV blocks up to it that this request computed
    (the engine caches every full block) are `cache_creation_input_tokens`. So input +
    creation + read == prompt tokens, always.
    """

    cache_breakpoint: int | None
    block_size: int
    prefill_only: bool = False  # max_tokens 0: warm the cache, report no output
    search_tool: bool = False  # the request declared the search tool: usage carries server_tool_use

    def usage(self, u: Usage, searches: int = 0) -> dict[str, Any]:
        """`searches`: the search tool's searches the service answered (the final usage's)."""
        read = min(u.cached_tokens, u.prompt_tokens)
        creation = 0
        if self.cache_breakpoint and self.block_size:
            cached_end = (min(self.cache_breakpoint, u.prompt_tokens - 1) // self.block_size) * self.block_size
            creation = max(0, cached_end - read)
        return {
            "input_tokens": u.prompt_tokens - read - creation,
            "cache_creation_input_tokens": creation,
            "cache_read_input_tokens": read,
            "cache_creation": {"ephemeral_5m_input_tokens": creation, "ephemeral_1h_input_tokens": 0},
            "output_tokens": 0 if self.prefill_only else u.output_tokens,
            "service_tier": "standard",
        } | (
            {"server_tool_use": {"web_search_requests": searches, "web_fetch_requests": 0}} if self.search_tool else {}
        )


def plan_for(gen: Generation) -> UsagePlan:
    p = gen.prepared
    block_size = p.planner.fleet.block_size(p.plan.model_id, p.plan.version)
    return UsagePlan(p.prompt.cache_breakpoint, block_size, p.request.prefill_only, p.request.search_tool is not None)


def stop_details(r: Refused) -> dict[str, Any]:
    return {"type": "refusal", "category": r.category, "explanation": r.explanation}


def stop_reason(final: Finished) -> str:
    if final.paused:
        return "pause_turn"
    return "tool_use" if final.called_tools else STOP_REASONS[final.reason]


def content_blocks(blocks: list[str | ToolCallDone | ServerToolResult]) -> list[dict[str, Any]]:
    """A tool-using reply's content: its text runs, calls and search results in order (a reply
    with none of them is one empty text block, as a plain reply is)."""
    out: list[dict[str, Any]] = []
    for b in blocks:
        if isinstance(b, str):
            if b:
                out.append({"type": "text", "text": b})
        elif isinstance(b, ServerToolResult):
            out.append(result_block(b))
        else:
            out.append(
                {"type": "server_tool_use" if b.server else "tool_use", "id": b.id, "name": b.name, "input": b.input}
            )
    return out or [{"type": "text", "text": ""}]


def message_object(
    msg_id: str,
    model: str,
    text: str | None | list[dict[str, Any]],
    stop_reason: str | None,
    stop_sequence: str | None,
    usage: dict[str, Any],
) -> dict[str, Any]:
    """`text`: the reply's one text block (None: no content), or its content blocks."""
    content = text if isinstance(text, list) else [] if text is None else [{"type": "text", "text": text}]
    return {
        "id": msg_id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": stop_reason,
        "stop_sequence": stop_sequence,
        "usage": usage,
    }


def render_message(gen: Generation, collected: Collected, plan: UsagePlan) -> dict[str, Any]:
    """The non-streaming reply; a failure raises the ServingError its kind maps to."""
    req, final = gen.prepared.request, collected.final
    if isinstance(final, Failed):
        raise ServingError(final.kind, final.message, retry_after_s=1.0)
    if isinstance(final, Refused):
        body = message_object(req.request_id, req.model, collected.text, "refusal", None, plan.usage(final.usage))
        body["stop_details"] = stop_details(final)
        return body
    text: str | None | list[dict[str, Any]] = None if plan.prefill_only else collected.text
    if gen.prepared.tool_format is not None:
        text = content_blocks(collected.blocks)
    return message_object(
        req.request_id,
        req.model,
        text,
        stop_reason(final),
        final.stop_sequence,
        plan.usage(final.usage, final.server_tool_uses),
    )


class EventWriter:
    """Numbers a stream's events 1, 2, … (`id: <msg_id>:<seq>` on the wire) and renders one-line
    JSON `data` whose `type` repeats the event name."""

    def __init__(self, msg_id: str):
        self.msg_id = msg_id
        self.seq = 0

    def event(self, name: str, payload: dict[str, Any]) -> ReplayEvent:
        self.seq += 1
        data = json.dumps({"type": name, **payload}, separators=(",", ":"), ensure_ascii=False)
        return ReplayEvent(self.seq, name, data)

    def error(self, kind_type: str, message: str, request_id: str | None) -> ReplayEvent:
        return self.event("error", {"error": {"type": kind_type, "message": message}, "request_id": request_id})


class _Blocks:
    """Content block bookkeeping for one stream: indices 0, 1, … in order, one open at a time.
    A plain reply opens its text block at once (as before the first token); a reply that may
    call tools opens each block when its first piece arrives (a forced call is block 0)."""

    def __init__(self, w: EventWriter):
        self.w = w
        self.next = 0
        self.open: str | None = None  # "text" | "tool_use"

    def start(self, block: dict[str, Any]) -> ReplayEvent:
        self.open = block["type"]
        self.next += 1
        return self.w.event("content_block_start", {"index": self.next - 1, "content_block": block})

    def stop(self) -> list[ReplayEvent]:
        if self.open is None:
            return []
        self.open = None
        return [self.w.event("content_block_stop", {"index": self.next - 1})]

    def delta(self, delta: dict[str, Any]) -> ReplayEvent:
        return self.w.event("content_block_delta", {"index": self.next - 1, "delta": delta})

    def text(self, text: str) -> list[ReplayEvent]:
        out = [] if self.open == "text" else [*self.stop(), self.start({"type": "text", "text": ""})]
        return [*out, self.delta({"type": "text_delta", "text": text})]

    def end(self) -> list[ReplayEvent]:
        """Close the open block; a reply that produced none gets its empty text block."""
        return [*self.stop()] if self.next else [self.start({"type": "text", "text": ""}), *self.stop()]


async def render_stream(gen: Generation, plan: UsagePlan, request_id: str | None) -> AsyncGenerator[ReplayEvent, None]:
    """The event sequence of reference §4.3: `ping` first (bytes on the wire as the stream
    opens, before any output of a request still queued or in prefill), `message_start` with
    the prompt's usage at the first outcome, the content blocks (text deltas; a tool_use block
    with empty input, its `input_json_delta` pieces, its stop), `message_delta` + `message_stop`;
    a safety stop is Anthropic's refusal (block stop, `stop_reason: "refusal"`, message stop); a
    failure is an `error` event, then the end."""
    req = gen.prepared.request
    w = EventWriter(req.request_id)
    blocks = _Blocks(w)
    lazy = gen.prepared.tool_format is not None
    yield PING
    started = False
    async with aclosing(gen.outcomes()) as outcomes:
        async for outcome in outcomes:
            if isinstance(outcome, Failed):
                yield w.error(anthropic_error_type(outcome.kind), outcome.message, request_id)
                return
            if not started:
                started = True
                start = message_object(req.request_id, req.model, None, None, None, plan.usage(outcome.usage))
                yield w.event("message_start", {"message": start})
                if not plan.prefill_only and not lazy:
                    yield blocks.start({"type": "text", "text": ""})
            if isinstance(outcome, TextDelta):
                if outcome.text and not plan.prefill_only:
                    for event in blocks.text(outcome.text):
                        yield event
                continue
            if isinstance(outcome, ToolCallStarted):
                kind = "server_tool_use" if outcome.server else "tool_use"
                for event in [
                    *blocks.stop(),
                    blocks.start({"type": kind, "id": outcome.id, "name": outcome.name, "input": {}}),
                ]:
                    yield event
                continue
            if isinstance(outcome, ServerToolResult):  # whole in its start event, as Anthropic sends it
                for event in [*blocks.stop(), blocks.start(result_block(outcome)), *blocks.stop()]:
                    yield event
                continue
            if isinstance(outcome, ToolInputDelta):
                yield blocks.delta({"type": "input_json_delta", "partial_json": outcome.json})
                continue
            if isinstance(outcome, ToolCallDone):
                for event in blocks.stop():
                    yield event
                continue
            if not plan.prefill_only:
                for event in blocks.end():
                    yield event
            if isinstance(outcome, Refused):
                delta = {"stop_reason": "refusal", "stop_sequence": None, "stop_details": stop_details(outcome)}
            else:
                assert isinstance(outcome, Finished)
                delta = {"stop_reason": stop_reason(outcome), "stop_sequence": outcome.stop_sequence}
            searches = outcome.server_tool_uses if isinstance(outcome, Finished) else 0
            yield w.event("message_delta", {"delta": delta, "usage": plan.usage(outcome.usage, searches)})
            yield w.event("message_stop", {})
            return
