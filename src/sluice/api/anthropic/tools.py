"""Anthropic `tools`, `tool_choice`, `output_config.format` / `output_format` → serving's terms.

- A client tool is `{name, description?, input_schema, strict?, cache_control?}` (`type`
  absent or "custom"); any other field is refused the way Anthropic refuses unknown fields.
  Server tools (a versioned `type`, e.g. web_search_20250305) are refused: none run here.
- `tool_choice` `{type: auto|any|tool|none, name?, disable_parallel_tool_use?}`; without it,
  `auto` (Anthropic's default when tools are given).
- Structured outputs: the generally available `output_config.format`, or the beta spelling
  `output_format`, accepted with the `anthropic-beta: structured-outputs-2025-11-13` header
  (as Anthropic still does during the transition); giving both is a 400.
"""

from __future__ import annotations

from collections.abc import Sequence

from sluice.api.anthropic.schema import CountTokensRequest, MessagesRequest, Tool, ToolChoice
from sluice.tool_types import ToolChoice as Choice
from sluice.tool_types import ToolChoiceMode, ToolSpec
from sluice.serving.errors import invalid
from sluice.serving.guided import OutputFormat

STRUCTURED_OUTPUTS_BETA = "structured-outputs-2025-11-13"


def tool_specs(tools: Sequence[Tool] | None) -> list[ToolSpec]:
    out: list[ToolSpec] = []
    for i, tool in enumerate(tools or ()):
        where = f"tools.{i}"
        if tool.type not in (None, "custom"):
            raise invalid(f"{where}.type: server tool {tool.type!r} is not supported; only client tools (with an input_schema) are")
        extra = sorted(tool.model_extra or {})
        if extra:
            raise invalid(f"{where}.{extra[0]}: Extra inputs are not permitted")
        if tool.input_schema is None:
            raise invalid(f"{where}.input_schema: Field required")
        if tool.input_schema.get("type") != "object":
            raise invalid(f"{where}.input_schema.type: Input should be 'object'")
        out.append(ToolSpec(tool.name, tool.input_schema, tool.description or "", bool(tool.strict)))
    return out


def tool_choice(choice: ToolChoice | None) -> Choice:
    if choice is None:
        return Choice()
    if choice.type != "tool" and choice.name is not None:
        raise invalid(f"tool_choice.name: only allowed with type 'tool', not {choice.type!r}")
    return Choice(ToolChoiceMode(choice.type), choice.name, bool(choice.disable_parallel_tool_use))


def output_format(body: MessagesRequest | CountTokensRequest, betas: Sequence[str]) -> OutputFormat | None:
    ga = body.output_config.format if body.output_config is not None else None
    beta = body.output_format
    if beta is not None and STRUCTURED_OUTPUTS_BETA not in betas:
        raise invalid(f"output_format: requires the 'anthropic-beta: {STRUCTURED_OUTPUTS_BETA}' header (or use output_config.format)")
    if ga is not None and beta is not None:
        raise invalid("output_format: give either output_config.format or output_format, not both")
    fmt = ga or beta
    return None if fmt is None else OutputFormat(fmt.json_schema)
