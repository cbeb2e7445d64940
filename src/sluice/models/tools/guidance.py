"""The grammar a request's tools, tool_choice and output format imply (a GuidedDecoding spec).

    tool_choice   grammar
    auto          text, or text then calls (`disable_parallel`: at most one call)
    any           one or more calls of any tool, no text first (at most one: disable_parallel)
    tool (name)   one or more calls of the named tool
    none          text that never opens a call
    no tools      the output schema's JSON if one is given, else unconstrained (None)

Arguments follow each tool's input_schema whenever the decoder can enforce it; a strict tool
whose schema it cannot enforce is refused (a clear error naming the keyword, from the engine's
validation), a non-strict one falls back to "any JSON object". With an output schema, the text
alternative is that schema's JSON (structured outputs and tools in one request).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from sluice.errors import InvalidRequestError
from sluice.models.tools.format import ToolFormat
from sluice.tool_types import ToolChoice, ToolChoiceMode, ToolSpec
from sluice.types import GuidedDecoding, GuidedKind, ToolGrammar


def schema_text(schema: Any) -> str:
    """Compact JSON text of a schema; key order is kept (it is the generation order)."""
    return json.dumps(schema, separators=(",", ":"), ensure_ascii=False)


def json_schema_guidance(schema: dict[str, Any]) -> GuidedDecoding:
    """Structured output: the whole reply is JSON that validates against `schema`."""
    return GuidedDecoding(GuidedKind.JSON_SCHEMA, schema=schema_text(schema))


def json_object_guidance() -> GuidedDecoding:
    """OpenAI `response_format: {"type": "json_object"}`: any JSON object."""
    return GuidedDecoding(GuidedKind.JSON_OBJECT)


def tool_guidance(
    tools: Sequence[ToolSpec],
    choice: ToolChoice,
    fmt: ToolFormat,
    output_schema: dict[str, Any] | None = None,
) -> GuidedDecoding | None:
    """The spec for one request; raises InvalidRequestError for a choice the tools cannot meet."""
    if choice.mode is ToolChoiceMode.TOOL:
        if not choice.name:
            raise InvalidRequestError("tool_choice: type 'tool' needs the tool's name")
        named = [t for t in tools if t.name == choice.name]
        if not named:
            known = ", ".join(t.name for t in tools) or "none"
            raise InvalidRequestError(f"tool_choice: tool {choice.name!r} is not in tools (known: {known})")
        tools = named
    if choice.mode in (ToolChoiceMode.ANY, ToolChoiceMode.TOOL) and not tools:
        raise InvalidRequestError(f"tool_choice: {choice.mode.value!r} needs at least one tool")
    if not tools or choice.mode is ToolChoiceMode.NONE and output_schema is not None:
        return json_schema_guidance(output_schema) if output_schema is not None else None
    forced = choice.mode in (ToolChoiceMode.ANY, ToolChoiceMode.TOOL)
    return GuidedDecoding(
        kind=GuidedKind.TOOL_CALLS,
        schema=schema_text(output_schema) if output_schema is not None else "",
        tools=tuple(ToolGrammar(t.name, schema_text(t.input_schema), t.strict) for t in tools),
        calls=fmt.call_syntax(),
        allow_text=not forced,
        min_calls=1 if forced else 0,
        max_calls=0 if choice.mode is ToolChoiceMode.NONE else (1 if choice.disable_parallel else None),
    )
