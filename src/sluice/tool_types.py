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
