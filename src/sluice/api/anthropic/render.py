"""Anthropic wire objects built from engine results: usage, stop reasons, messages, SSE frames."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from sse_starlette import ServerSentEvent

from sluice.types import FinishReason, Usage

STOP_REASONS = {
    FinishReason.EOS: "end_turn",
    FinishReason.LENGTH: "max_tokens",
    FinishReason.STOP_SEQUENCE: "stop_sequence",
    FinishReason.CONTEXT: "model_context_window_exceeded",
}


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

    def usage(self, u: Usage) -> dict[str, Any]:
        read = min(u.cached_tokens, u.prompt_tokens)
        creation = 0
        if self.cache_breakpoint:
            cached_end = (min(self.cache_breakpoint, u.prompt_tokens - 1) // self.block_size) * self.block_size
            creation = max(0, cached_end - read)
        output = 0 if self.prefill_only else u.output_tokens
        return {
            "input_tokens": u.prompt_tokens - read - creation,
            "cache_creation_input_tokens": creation,
            "cache_read_input_tokens": read,
            "cache_creation": {"ephemeral_5m_input_tokens": creation, "ephemeral_1h_input_tokens": 0},
            "output_tokens": output,
            "service_tier": "standard",
        }


def message_object(
    msg_id: str, model: str, text: str | None, stop_reason: str | None, stop_sequence: str | None, usage: dict[str, Any]
) -> dict[str, Any]:
    content = [] if text is None else [{"type": "text", "text": text}]
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


class EventWriter:
    """Numbers a stream's events `id: <msg_id>:<seq>` and renders one-line JSON `data`."""

    def __init__(self, msg_id: str):
        self.msg_id = msg_id
        self.seq = 0

    def event(self, name: str, payload: dict[str, Any]) -> ServerSentEvent:
        self.seq += 1
        data = json.dumps({"type": name, **payload}, separators=(",", ":"), ensure_ascii=False)
        return ServerSentEvent(data=data, event=name, id=f"{self.msg_id}:{self.seq}")

    def ping(self) -> ServerSentEvent:
        # Pings carry no id: they are not part of the replayable content of the stream.
        return ServerSentEvent(data='{"type":"ping"}', event="ping")

    def error(self, error_type: str, message: str, request_id: str | None) -> ServerSentEvent:
        return self.event("error", {"error": {"type": error_type, "message": message}, "request_id": request_id})
