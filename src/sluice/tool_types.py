"""Tools, tool choices, calls and results as plain data: what both wire formats reduce to.

The API layer builds these from Anthropic `tools` / `tool_choice` / `tool_use` / `tool_result`
or OpenAI `tools` / `tool_choice` / `tool_calls` / `role: "tool"` messages; nothing here knows
either wire shape. A leaf (like types.py): the API converts into these, serving carries them,
and models/tools/ renders and parses them, so none of those reaches into another for them.
"""

from __future__ import annotations

import enum
import secrets
import string
from dataclasses import dataclass, field
from typing import Any

_BASE62 = string.ascii_letters + string.digits


def new_tool_use_id(prefix: str = "toolu_") -> str:
    """`toolu_` + 24 base62 characters, Anthropic's shape (pass "call_" for OpenAI's)."""
    return prefix + "".join(secrets.choice(_BASE62) for _ in range(24))


class ToolChoiceMode(str, enum.Enum):
    AUTO = "auto"  # the model chooses: text, or text then calls
    ANY = "any"  # at least one call, of any tool (OpenAI "required")
    TOOL = "tool"  # at least one call, of the named tool (OpenAI {"type": "function", ...})
    NONE = "none"  # no call; the tools are still shown to the model


class Role(str, enum.Enum):
    SYSTEM = "system"
    USER = "user"
    ASSISTANT = "assistant"


@dataclass(slots=True, frozen=True)
class ToolSpec:
    """A client tool. `strict`: its input must validate against `input_schema`, and a schema
    the decoder cannot enforce is refused; a non-strict tool falls back to "any JSON object"."""

    name: str
    input_schema: dict[str, Any] = field(default_factory=lambda: {"type": "object"})
    description: str = ""
    strict: bool = False


@dataclass(slots=True, frozen=True)
class ToolChoice:
    mode: ToolChoiceMode = ToolChoiceMode.AUTO
    name: str | None = None  # ToolChoiceMode.TOOL only
    disable_parallel: bool = False  # at most one call


@dataclass(slots=True)
class ToolCall:
    id: str
    name: str
    input: dict[str, Any]


@dataclass(slots=True)
class ToolResult:
    tool_use_id: str
    content: str  # the result's text (a content list is joined by the API layer)
    is_error: bool = False


Part = str | ToolCall | ToolResult  # str: a text block


@dataclass(slots=True)
class ChatTurn:
    """One message: a role and its parts in order (text, tool calls, tool results)."""

    role: Role
    parts: list[Part] = field(default_factory=list)


# -- the search server tool (docs/SEARCH.md "The Messages API search tool") -------------------
# The model sees it as a client tool with this one-field input, so its calls are decoded under
# the same grammar as any tool's; the gateway runs them itself against the fleet's search
# service. The query is bounded by the grammar (the search router refuses longer ones anyway).
SEARCH_QUERY_MAX_CHARS = 256
SEARCH_TOOL_DESCRIPTION = (
    "Search the documents of this service's search index. Input: a short keyword query. "
    "Returns the best matching documents, each with its title, source and text."
)


def search_tool_spec(name: str) -> ToolSpec:
    """The tool the model is offered for a declared search server tool (strict: the input is
    always exactly `{"query": <non-empty string>}`)."""
    schema = {
        "type": "object",
        "properties": {"query": {"type": "string", "minLength": 1, "maxLength": SEARCH_QUERY_MAX_CHARS}},
        "required": ["query"],
        "additionalProperties": False,
    }
    return ToolSpec(name, schema, SEARCH_TOOL_DESCRIPTION, strict=True)


@dataclass(slots=True, frozen=True)
class SearchToolUse:
    """A request's search server tool: the name the model calls it by, how many searches the
    request may run (None: the fleet's `search.max_uses`), and its domain lists as given
    (checked by the API; applied by serving/search_tool/domains.py)."""

    name: str
    max_uses: int | None = None
    allowed_domains: tuple[str, ...] | None = None
    blocked_domains: tuple[str, ...] | None = None


@dataclass(slots=True, frozen=True)
class SearchResult:
    """One document a search returned, as the model reads it (a `search_result` block): for
    the search tool, its snippet as `text` and its age as the page says it (None: unknown)."""

    source: str
    title: str
    text: str
    page_age: str | None = None

    def render(self) -> str:
        """The one spelling of a search result in a prompt: title, source, age, text on their own lines."""
        age = f"page age: {self.page_age}" if self.page_age else ""
        return "\n".join(p for p in (self.title, self.source, age, self.text) if p)


def search_tool_result(tool_use_id: str, results: list[SearchResult], error_code: str | None = None) -> ToolResult:
    """A search tool call's result as the model reads it: its search results one after another
    (the same text a client's `tool_result` of `search_result` blocks reads as), or the error."""
    if error_code is not None:
        return ToolResult(tool_use_id, f"search error: {error_code}", is_error=True)
    if not results:
        return ToolResult(tool_use_id, "no results")
    return ToolResult(tool_use_id, "\n\n".join(r.render() for r in results))
