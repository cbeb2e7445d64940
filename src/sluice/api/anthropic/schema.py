"""The Anthropic Messages request body as pydantic models (reference §2).

Every documented field is accepted (the content blocks: api/anthropic/blocks.py); fields a
text-only local model cannot honour (thinking, service_tier, …) are accepted and ignored, as the
contract allows. Tools, tool_choice and the
structured-output formats are interpreted (api/anthropic/tools.py). Truly unknown fields are
rejected with Anthropic's own wording: `<path>: Extra inputs are not permitted`.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from sluice.api.anthropic.blocks import CacheControl, ContentBlock, TextBlock
from sluice.api.anthropic.blocks import Strict as _Strict
from sluice.api.wire_types import Count, Seed


class _Open(BaseModel):
    """Objects whose inner shape we do not interpret (tool schemas, server-tool configs)."""

    model_config = ConfigDict(extra="allow")


class Message(_Strict):
    role: Literal["user", "assistant", "system"]
    content: str | list[ContentBlock]


class Metadata(_Strict):
    user_id: str | None = None


class Tool(_Open):
    """A client tool (`type` absent or "custom"), or a server tool (a versioned `type` such as
    web_search_20250305, refused by the converter: we run no server tools). Open so a server
    tool's own fields parse; a client tool's extra fields are refused by the converter."""

    name: str
    type: str | None = None
    description: str | None = None
    input_schema: dict[str, Any] | None = None
    strict: bool | None = None
    cache_control: CacheControl | None = None
    # accepted and ignored: every tool is shown to the model (no deferred loading, no tool
    # search), every call is the model's own, inputs stream as they are written
    allowed_callers: list[str] | None = None
    defer_loading: bool | None = None
    eager_input_streaming: bool | None = None
    input_examples: list[dict[str, Any]] | None = None


class ToolChoice(_Strict):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None


class JsonOutputFormat(_Strict):
    """`{"type": "json_schema", "schema": {...}}` (output_config.format and the beta output_format)."""

    model_config = ConfigDict(extra="forbid", strict=True, populate_by_name=True)
    type: Literal["json_schema"]
    json_schema: dict[str, Any] = Field(alias="schema")


class OutputConfig(_Open):
    """`format` is interpreted; other keys (effort, …) are accepted and ignored."""

    format: JsonOutputFormat | None = None


class CountTokensRequest(_Strict):
    """The prompt's fields: what count_tokens reads, and what a Messages request starts from."""

    model: str
    messages: list[Message]
    system: str | list[TextBlock] | None = None
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    thinking: dict[str, Any] | None = None
    cache_control: CacheControl | None = None
    output_config: OutputConfig | None = None
    # the structured-outputs beta spelling (with anthropic-beta: structured-outputs-2025-11-13)
    output_format: JsonOutputFormat | None = None
    # newer (v2) fields: accepted, not interpreted
    speed: Literal["standard", "fast"] | None = None
    mcp_servers: list[dict[str, Any]] | None = None
    context_management: dict[str, Any] | None = None


class MessagesRequest(CountTokensRequest):
    """The prompt's fields and the generation's."""

    max_tokens: Count
    stop_sequences: list[str] | None = None
    stream: bool = False
    temperature: float | None = Field(None, ge=0.0, le=1.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: Count | None = None
    metadata: Metadata | None = None
    service_tier: Literal["auto", "standard_only"] | None = None
    # newer (v2) fields: accepted, not interpreted
    container: Any = None
    inference_geo: str | None = None
    diagnostics: dict[str, Any] | None = None
    # sluice extensions
    seed: Seed | None = None  # reproducible sampling (send through extra_body)
    background: bool = False  # keep generating after a disconnect, for resume (issue 6)
