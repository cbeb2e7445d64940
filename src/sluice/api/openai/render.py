"""Pipeline outcomes → OpenAI's wire objects: the chat.completion and its streamed chunks."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any

from sse_starlette import ServerSentEvent

from sluice.api.errors import openai_error_type
from sluice.api.openai.logprobs import chat_content, chat_logprobs
from sluice.serving.choices import merged
from sluice.serving.errors import ServingError
from sluice.serving.outcomes import (
    Failed,
    Finished,
    Refused,
    TextDelta,
    ToolCallDone,
    ToolCallStarted,
    ToolInputDelta,
)
from sluice.serving.pipeline import Collected, Generation
from sluice.streaming.event_log import LogGap
from sluice.streaming.replay_log import ReplayEvent
from sluice.types import FinishReason, Usage

FINISH = {
    FinishReason.EOS: "stop",
    FinishReason.STOP_SEQUENCE: "stop",
    FinishReason.LENGTH: "length",
    FinishReason.CONTEXT: "length",
}


def usage_object(u: Usage) -> dict[str, Any]:
    return {
        "prompt_tokens": u.prompt_tokens,
        "completion_tokens": u.output_tokens,
        "total_tokens": u.prompt_tokens + u.output_tokens,
        "prompt_tokens_details": {"cached_tokens": u.cached_tokens},
    }


def _finish_reason(final: Finished | Refused) -> str:
    if isinstance(final, Refused):
        return "content_filter"
    return "tool_calls" if final.called_tools else FINISH[final.reason]


def _message(collected: Collected, tools: bool) -> dict[str, Any]:
    """The assistant message; with calls, `tool_calls` (arguments: the JSON text as written, so
    it equals the streamed fragments joined) and `content` null when there is no text."""
    message: dict[str, Any] = {"role": "assistant", "content": collected.text, "refusal": None}
    calls = [b for b in collected.blocks if isinstance(b, ToolCallDone)] if tools else []
    if calls:
        message["content"] = collected.text or None
        message["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}} for c in calls
        ]
    return message


def _asked(gen: Generation) -> bool:
    return gen.prepared.generation.sampling.logprobs is not None


def _ended_by_eos(final: object) -> bool:
    return isinstance(final, Finished) and final.reason is FinishReason.EOS


def _logprobs(gen: Generation, collected: Collected) -> dict[str, Any] | None:
    if not _asked(gen):
        return None
    return chat_logprobs(collected.logprobs, gen.prepared.tokenizer, _ended_by_eos(collected.final), collected.text)


def render_completion(reply_id: str, gens: list[Generation], collected: list[Collected]) -> dict[str, Any]:
    """The non-streaming reply, one choice per generation (n); a failure raises the
    ServingError its kind maps to."""
    req = gens[0].prepared.request
    for c in collected:
        if isinstance(c.final, Failed):
            raise ServingError(c.final.kind, c.final.message, retry_after_s=1.0)
    return {
        "id": reply_id,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": req.model,
        "choices": [
            {
                "index": i,
                "message": _message(c, gen.prepared.tool_format is not None),
                "finish_reason": _finish_reason(c.final),  # type: ignore[arg-type]
                "logprobs": _logprobs(gen, c),
            }
            for i, (gen, c) in enumerate(zip(gens, collected))
        ],
        "usage": usage_object(_choices_usage([c.final.usage for c in collected])),
    }


def _choices_usage(usages: list[Usage]) -> Usage:
    """n choices of one prompt: the prompt counted once, every choice's output."""
    return Usage(usages[0].prompt_tokens, sum(u.output_tokens for u in usages), usages[0].cached_tokens)


def _error_json(message: str, kind: str) -> str:
    return json.dumps({"error": {"message": message, "type": kind, "param": None, "code": None}})


def error_event(message: str, kind: str) -> ServerSentEvent:
    return ServerSentEvent(data=_error_json(message, kind))


@dataclass(slots=True)
class _Chunks:
    """A stream's `chat.completion.chunk` frames: one choice's delta, or the usage alone."""

    reply_id: str
    created: int
    model: str
    include_usage: bool

    def __call__(
        self,
        index: int,
        delta: dict[str, Any],
        finish: str | None,
        usage: Usage | None = None,
        choices: bool = True,
        logprobs: dict[str, Any] | None = None,
    ) -> ServerSentEvent:
        body: dict[str, Any] = {
            "id": self.reply_id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
        }
        body["choices"] = (
            [{"index": index, "delta": delta, "finish_reason": finish, "logprobs": logprobs}] if choices else []
        )
        if self.include_usage:
            body["usage"] = None if usage is None else usage_object(usage)
        return ServerSentEvent(data=json.dumps(body, separators=(",", ":"), ensure_ascii=False))


async def render_chunks(
    reply_id: str, gens: list[Generation], include_usage: bool
) -> AsyncGenerator[ServerSentEvent, None]:
    """`data:` chunks (n choices: interleaved, each with its index), each choice's last one with
    `finish_reason`, an optional usage chunk, `[DONE]`; a failure after the stream started is
    an error chunk, then the end."""
    chunk = _Chunks(reply_id, int(time.time()), gens[0].prepared.request.model, include_usage)
    tokenizer = gens[0].prepared.tokenizer if _asked(gens[0]) else None
    yield ServerSentEvent(comment="ping")  # bytes on the wire at once, before queueing and prefill
    started = [False] * len(gens)
    usages: list[Usage | None] = [None] * len(gens)
    text_bytes = [0] * len(gens)  # per choice: content sent, and the bytes its logprob tokens spell
    scored_bytes = [0] * len(gens)
    async with aclosing(merged(gens)) as outcomes:
        async for i, outcome in outcomes:
            if isinstance(outcome, Failed):
                yield error_event(outcome.message, openai_error_type(outcome.kind))
                return
            if not started[i]:
                started[i] = True
                yield chunk(i, {"role": "assistant", "content": ""}, None)
            if isinstance(outcome, TextDelta):
                if outcome.text:
                    scored = None
                    if tokenizer is not None:
                        scored = {"content": chat_content(outcome.logprobs, tokenizer, False)}
                        text_bytes[i] += len(outcome.text.encode())
                        scored_bytes[i] += sum(len(e["bytes"]) for e in scored["content"])
                    yield chunk(i, {"content": outcome.text}, None, logprobs=scored)
                continue
            if isinstance(outcome, ToolCallStarted):
                call = {
                    "index": outcome.index,
                    "id": outcome.id,
                    "type": "function",
                    "function": {"name": outcome.name, "arguments": ""},
                }
                yield chunk(i, {"tool_calls": [call]}, None)
                continue
            if isinstance(outcome, ToolInputDelta):
                yield chunk(
                    i, {"tool_calls": [{"index": outcome.index, "function": {"arguments": outcome.json}}]}, None
                )
                continue
            if not isinstance(outcome, (Finished, Refused)):
                continue  # ToolCallDone; a server tool's result is Anthropic's block: the OpenAI wire has none
            if tokenizer is not None and isinstance(outcome, Finished):  # the tokens whose text came last (or none)
                rest = chat_content(
                    outcome.logprobs, tokenizer, _ended_by_eos(outcome), max(0, text_bytes[i] - scored_bytes[i])
                )
                if rest:
                    yield chunk(i, {"content": ""}, None, logprobs={"content": rest})
            yield chunk(i, {}, _finish_reason(outcome))
            usages[i] = outcome.usage
    if include_usage:
        yield chunk(0, {}, None, _choices_usage([u or Usage() for u in usages]), choices=False)
    yield ServerSentEvent(data="[DONE]")


# A keyed stream is recorded in the replay log (its retries replay it): chunks are numbered
# events there, and sent as plain `data:` frames again — OpenAI streams carry no event names or ids.
CHUNK = "chunk"


async def chunk_events(chunks: AsyncIterator[ServerSentEvent]) -> AsyncGenerator[ReplayEvent, None]:
    """`render_chunks` as numbered replay events (its keep-alive comments are not content)."""
    seq = 0
    async for frame in chunks:
        if frame.data is not None:
            seq += 1
            yield ReplayEvent(seq, CHUNK, frame.data)


async def chunk_frames(events: AsyncIterator[ReplayEvent]) -> AsyncGenerator[ServerSentEvent, None]:
    """Replay events back as the frames they were (any other event, a ping, is a keep-alive)."""
    async for event in events:
        yield ServerSentEvent(data=event.data) if event.name == CHUNK else ServerSentEvent(comment="ping")


async def followed(events: AsyncIterator[ReplayEvent]) -> AsyncGenerator[ReplayEvent, None]:
    """A recorded stream followed from the replay log: a keep-alive at once, then its chunks; an
    error chunk if the log no longer holds them."""
    yield ReplayEvent(0, "ping", "")
    try:
        async for event in events:
            yield event
    except LogGap as exc:
        yield ReplayEvent(0, CHUNK, _error_json(str(exc), "server_error"))


def cut_chunk(seq: int) -> ReplayEvent:
    """The recorded end of a stream cut short (the server stopped before it finished)."""
    return ReplayEvent(seq, CHUNK, _error_json("the stream ended before it finished", "server_error"))


def ended_well(last: ReplayEvent) -> bool:
    return last.data == "[DONE]"
