"""Response bodies as pydantic models, for the OpenAPI document only (nothing validates with them).

The routes build their replies as dicts (renderers in api/anthropic and api/openai); these
models say what those dicts hold, so a schema-driven client knows, and the fuzz test
(tests/unit/api/test_openapi_fuzz.py) checks every reply it gets against them. Request bodies need no
models here: the document uses the same models that validate the requests.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict


class _Doc(BaseModel):
    # replies may gain fields: a client must ignore what it does not know
    model_config = ConfigDict(extra="allow")


class ErrorCode(_Doc):
    error_code: str


class AnthropicErrorDetail(_Doc):
    type: Literal[
        "invalid_request_error",
        "authentication_error",
        "permission_error",
        "not_found_error",
        "timeout_error",
        "request_too_large",
        "rate_limit_error",
        "api_error",
        "overloaded_error",
    ]
    message: str
    details: ErrorCode | None = None


class AnthropicError(_Doc):
    """Every error on the Anthropic routes (and on routes that belong to neither wire format)."""

    type: Literal["error"]
    error: AnthropicErrorDetail
    request_id: str | None


class OpenAIErrorDetail(_Doc):
    message: str
    type: str
    param: str | None
    code: str | None


class OpenAIError(_Doc):
    """Every error on the OpenAI routes (`/v1/chat/...`)."""

    error: OpenAIErrorDetail


class CacheCreation(_Doc):
    ephemeral_5m_input_tokens: int
    ephemeral_1h_input_tokens: int


class ServerToolUsage(_Doc):
    web_search_requests: int  # the search tool's searches the search service answered
    web_fetch_requests: int  # always 0: no web fetch tool runs here


class MessageUsage(_Doc):
    input_tokens: int
    output_tokens: int
    cache_creation_input_tokens: int
    cache_read_input_tokens: int
    cache_creation: CacheCreation
    service_tier: Literal["standard", "priority", "batch"]
    server_tool_use: ServerToolUsage | None = None  # when the request declares the search tool


class OutputText(_Doc):
    type: Literal["text"]
    text: str


class OutputToolUse(_Doc):
    """A client tool call (`tool_use`) or a search tool call (`server_tool_use`, docs/SEARCH.md)."""

    type: Literal["tool_use", "server_tool_use"]
    id: str
    name: str
    input: dict[str, object]


class SearchHit(_Doc):
    type: Literal["web_search_result"]
    url: str
    title: str
    encrypted_content: str  # the hit's text, base64 (not encrypted; send it back unchanged)
    page_age: str | None


class SearchError(_Doc):
    type: Literal["web_search_tool_result_error"]
    error_code: str


class OutputSearchResult(_Doc):
    """The search tool's result for the `server_tool_use` block with this `tool_use_id`."""

    type: Literal["web_search_tool_result"]
    tool_use_id: str
    content: list[SearchHit] | SearchError


class StopDetails(_Doc):
    type: Literal["refusal"]
    category: str
    explanation: str


class MessageObject(_Doc):
    """A non-streaming `POST /v1/messages` reply."""

    id: str
    type: Literal["message"]
    role: Literal["assistant"]
    model: str
    content: list[OutputText | OutputToolUse | OutputSearchResult]
    stop_reason: Literal[
        "end_turn", "max_tokens", "stop_sequence", "tool_use", "pause_turn", "refusal", "model_context_window_exceeded"
    ]
    stop_sequence: str | None
    usage: MessageUsage
    stop_details: StopDetails | None = None


class TokenCount(_Doc):
    input_tokens: int


class ModelInfo(_Doc):
    type: Literal["model"]
    id: str
    display_name: str
    created_at: str
    max_input_tokens: int | None
    max_tokens: int | None
    # OpenAI's model object (and vLLM's lineage): a LoRA adapter's parent is its base model
    object: Literal["model"]
    created: int
    owned_by: str
    root: str
    parent: str | None


class ModelList(_Doc):
    data: list[ModelInfo]
    has_more: bool
    first_id: str | None
    last_id: str | None


class RequestCounts(_Doc):
    processing: int
    succeeded: int
    errored: int
    canceled: int
    expired: int


class MessageBatch(_Doc):
    id: str
    type: Literal["message_batch"]
    processing_status: Literal["in_progress", "canceling", "ended"]
    request_counts: RequestCounts
    created_at: str
    expires_at: str
    ended_at: str | None
    cancel_initiated_at: str | None
    archived_at: str | None
    results_url: str | None


class MessageBatchList(_Doc):
    data: list[MessageBatch]
    has_more: bool
    first_id: str | None
    last_id: str | None


class DeletedBatch(_Doc):
    id: str
    type: Literal["message_batch_deleted"]


class PromptTokensDetails(_Doc):
    cached_tokens: int


class CompletionUsage(_Doc):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails


class AssistantMessage(_Doc):
    role: Literal["assistant"]
    content: str
    refusal: str | None


class TopLogprob(_Doc):
    token: str
    logprob: float
    bytes: list[int]


class TokenLogprobEntry(_Doc):
    token: str
    logprob: float
    bytes: list[int]
    top_logprobs: list[TopLogprob]


class ChoiceLogprobs(_Doc):
    content: list[TokenLogprobEntry]
    refusal: None = None


class Choice(_Doc):
    index: int
    message: AssistantMessage
    finish_reason: Literal["stop", "length", "content_filter", "tool_calls"]
    logprobs: ChoiceLogprobs | None = None


class ChatCompletion(_Doc):
    """A non-streaming `POST /v1/chat/completions` reply."""

    id: str
    object: Literal["chat.completion"]
    created: int
    model: str
    choices: list[Choice]
    usage: CompletionUsage


class LegacyLogprobs(_Doc):
    """Parallel lists over the choice's tokens (the echoed prompt's first: its first logprob null)."""

    tokens: list[str]
    token_logprobs: list[float | None]
    top_logprobs: list[dict[str, float] | None]
    text_offset: list[int]


class TextChoice(_Doc):
    text: str
    index: int
    logprobs: LegacyLogprobs | None
    finish_reason: Literal["stop", "length", "content_filter"]


class TextCompletion(_Doc):
    """A non-streaming `POST /v1/completions` reply."""

    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    choices: list[TextChoice]
    usage: CompletionUsage


class TokenizeResult(_Doc):
    """`POST /tokenize`: the ids (and, with return_token_strs, each token's text)."""

    tokens: list[int]
    count: int
    max_model_len: int
    token_strs: list[str] | None = None


class DetokenizeResult(_Doc):
    """`POST /detokenize`."""

    prompt: str


class Health(_Doc):
    status: str


class Readiness(_Doc):
    status: str
    model: str | None = None


RESPONSE_MODELS: tuple[type[BaseModel], ...] = (
    AnthropicError,
    OpenAIError,
    MessageObject,
    TokenCount,
    ModelInfo,
    ModelList,
    MessageBatch,
    MessageBatchList,
    DeletedBatch,
    ChatCompletion,
    TextCompletion,
    TokenizeResult,
    DetokenizeResult,
    Health,
    Readiness,
)
