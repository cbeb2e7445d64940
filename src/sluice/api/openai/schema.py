"""The OpenAI chat completions request body as pydantic models (strict JSON types)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from sluice.api.wire_types import Count, JsonInt, LogprobCount, PositiveCount, Seed


class _Strict(BaseModel):
    # strict: JSON booleans and integers only ("stream": "yes" is a 400)
    model_config = ConfigDict(extra="forbid", strict=True)


class TextPart(_Strict):
    type: Literal["text"]
    text: str


class ChatMessage(_Strict):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None
    refusal: str | None = None


class StreamOptions(_Strict):
    include_usage: bool = False
    include_obfuscation: bool | None = None


class ChatCompletionRequest(_Strict):
    model: str
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: PositiveCount | None = None
    max_completion_tokens: PositiveCount | None = None
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: Count | None = None  # not OpenAI's; vLLM-compatible extension
    ignore_eos: bool = False  # not OpenAI's; vLLM / llama.cpp extension: generate max_tokens whatever EOS says
    n: JsonInt = Field(1, ge=1, le=16)  # choices, sharing the prompt's KV blocks
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    seed: Seed | None = None
    # accepted for compatibility; not applied by this engine (documented in docs/API.md)
    presence_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    logit_bias: dict[str, float] | None = None
    logprobs: bool | None = None  # applied: the model's logprob of each output token
    top_logprobs: LogprobCount | None = None  # and this many alternatives (needs logprobs)
    user: str | None = None
    response_format: dict[str, Any] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None
    metadata: dict[str, str] | None = None
    store: bool | None = None
    service_tier: str | None = None
    reasoning_effort: str | None = None
    modalities: list[str] | None = None
    prediction: dict[str, Any] | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None
