"""The content blocks an Anthropic request may carry, as pydantic models (reference §2.1).

Every block type and every field the current API documents is accepted — the list is the
official SDK's request types (`anthropic/types/*_block_param.py`, the members of
`ContentBlockParam` and of a tool_result's content), checked by
tests/unit/api/test_anthropic_sdk_fields.py, so a field a newer SDK sends (as `caller` and
`toolset_name` on `tool_use`, which a `model_dump()` of the SDK's own reply blocks carries) is
caught there. A field nobody documents is still refused (`<path>: Extra inputs are not
permitted`). What a block's fields mean is decided by the converter (api/anthropic/prompt.py):
fields a local model cannot use (`caller`, `toolset_name`, `citations`, `transformations`, …)
are accepted and ignored, as `thinking` is; the web search tool's blocks (`server_tool_use`
named `web_search`, `web_search_tool_result`) are its calls and results (the search tool,
docs/SEARCH.md); block types that belong to other server tools, none of which run here, are
refused there with a 400 that names them.

Only the blocks' own keys are checked: the inner shape of payloads sluice never reads (image and
document sources, citations, server-tool results) is taken as it comes.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class Strict(BaseModel):
    # strict: the SDKs send JSON booleans and integers; "stream": "yes" is a 400, not a stream
    model_config = ConfigDict(extra="forbid", strict=True)


class CacheControl(Strict):
    type: Literal["ephemeral"]
    ttl: Literal["5m", "1h"] | None = None


class Caller(Strict):
    """Who made a tool call: `{"type": "direct"}` (the model), or a server tool's program
    (`{"type": "code_execution_…", "tool_id": …}`). Ignored: every call here is direct."""

    type: str
    tool_id: str | None = None


class TextBlock(Strict):
    type: Literal["text"]
    text: str
    cache_control: CacheControl | None = None
    citations: list[dict[str, Any]] | None = None


class ImageBlock(Strict):
    type: Literal["image"]
    source: dict[str, Any]
    cache_control: CacheControl | None = None
    transformations: dict[str, Any] | None = None


class DocumentBlock(Strict):
    type: Literal["document"]
    source: dict[str, Any]
    title: str | None = None
    context: str | None = None
    citations: dict[str, Any] | None = None
    cache_control: CacheControl | None = None


class SearchResultBlock(Strict):
    type: Literal["search_result"]
    source: str
    title: str
    content: list[TextBlock]
    cache_control: CacheControl | None = None
    citations: dict[str, Any] | None = None


class ToolReferenceBlock(Strict):
    """A tool result naming a tool to load (client-side tool search). Every tool is in the
    prompt already (`defer_loading` is ignored), so it adds nothing: dropped."""

    type: Literal["tool_reference"]
    tool_name: str
    cache_control: CacheControl | None = None


class BrowserStateBlock(Strict):
    """The browser toolset's state in a tool result (refused: that toolset is not offered)."""

    type: Literal["browser_state"]
    tabs: list[dict[str, Any]]
    state_changes: list[dict[str, Any]] | None = None
    cache_control: CacheControl | None = None


ToolResultContent = Annotated[
    TextBlock | ImageBlock | DocumentBlock | SearchResultBlock | ToolReferenceBlock | BrowserStateBlock,
    Field(discriminator="type"),
]


class _ToolCall(Strict):
    """The model's call of a tool: the client's (`tool_use`) or a server tool's
    (`server_tool_use`); the SDK's two params carry the same keys but `toolset_name`."""

    id: str
    name: str
    input: dict[str, Any]
    cache_control: CacheControl | None = None
    caller: Caller | None = None


class ToolUseBlock(_ToolCall):
    type: Literal["tool_use"]
    toolset_name: str | None = None


class ToolResultBlock(Strict):
    type: Literal["tool_result"]
    tool_use_id: str
    content: str | list[ToolResultContent] | None = None
    is_error: bool | None = None
    cache_control: CacheControl | None = None
    toolset_name: str | None = None


class ThinkingBlock(Strict):
    type: Literal["thinking"]
    thinking: str
    signature: str | None = None


class RedactedThinkingBlock(Strict):
    type: Literal["redacted_thinking"]
    data: str


# -- blocks of server tools (web search and fetch, code execution, tool search, containers):
# accepted as documented; the converter reads web search's (our search tool) and refuses the
# others (none of those tools runs here)
class ServerToolUseBlock(_ToolCall):
    type: Literal["server_tool_use"]


class _ServerToolResult(Strict):
    tool_use_id: str
    content: Any
    cache_control: CacheControl | None = None


class WebSearchResult(Strict):
    """One hit of the search tool; `encrypted_content` carries its text (api/anthropic/search_blocks.py)."""

    type: Literal["web_search_result"]
    url: str
    title: str
    encrypted_content: str
    page_age: str | None = None


class WebSearchToolError(Strict):
    type: Literal["web_search_tool_result_error"]
    error_code: str


class _CallableToolResult(_ServerToolResult):
    """The result of a server tool a program may call (web search, web fetch): it names its
    caller, as the SDK's params do."""

    caller: Caller | None = None


class WebSearchToolResultBlock(_CallableToolResult):
    type: Literal["web_search_tool_result"]
    content: list[WebSearchResult] | WebSearchToolError  # the one server tool's result read here


class WebFetchToolResultBlock(_CallableToolResult):
    type: Literal["web_fetch_tool_result"]


class CodeExecutionToolResultBlock(_ServerToolResult):
    type: Literal["code_execution_tool_result"]


class BashCodeExecutionToolResultBlock(_ServerToolResult):
    type: Literal["bash_code_execution_tool_result"]


class TextEditorCodeExecutionToolResultBlock(_ServerToolResult):
    type: Literal["text_editor_code_execution_tool_result"]


class ToolSearchToolResultBlock(_ServerToolResult):
    type: Literal["tool_search_tool_result"]


class ContainerUploadBlock(Strict):
    type: Literal["container_upload"]
    file_id: str
    cache_control: CacheControl | None = None


SERVER_TOOL_BLOCKS = (
    ServerToolUseBlock,
    WebSearchToolResultBlock,
    WebFetchToolResultBlock,
    CodeExecutionToolResultBlock,
    BashCodeExecutionToolResultBlock,
    TextEditorCodeExecutionToolResultBlock,
    ToolSearchToolResultBlock,
    ContainerUploadBlock,
)

ContentBlock = Annotated[
    TextBlock
    | ImageBlock
    | DocumentBlock
    | SearchResultBlock
    | ToolUseBlock
    | ToolResultBlock
    | ThinkingBlock
    | RedactedThinkingBlock
    | ServerToolUseBlock
    | WebSearchToolResultBlock
    | WebFetchToolResultBlock
    | CodeExecutionToolResultBlock
    | BashCodeExecutionToolResultBlock
    | TextEditorCodeExecutionToolResultBlock
    | ToolSearchToolResultBlock
    | ContainerUploadBlock,
    Field(discriminator="type"),
]
