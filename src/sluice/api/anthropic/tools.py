"""Anthropic `tools`, `tool_choice`, `output_config.format` / `output_format` → serving's terms.

- A client tool is `{name, description?, input_schema, strict?, cache_control?}` (`type`
  absent or "custom"); any other field is refused the way Anthropic refuses unknown fields.
- The web search server tool (`web_search_20250305` and its later versions, name `web_search`)
  is sluice's search server tool: the gateway runs its calls against the fleet's own search
  service (docs/SEARCH.md), not the web. The model is offered it as a tool with input
  `{"query": string}` (tool_types.search_tool_spec). `max_uses` bounds the searches;
  `allowed_domains` / `blocked_domains` filter the hits by their `url`'s domain as Anthropic
  documents (serving/search_tool/domains.py: one list or the other, no scheme, subdomains
  included, paths with at most one `*`); `user_location` is checked and has no effect (the
  index has no places: docs/SEARCH.md). Other server tools are refused: none run here.
- `tool_choice` `{type: auto|any|tool|none, name?, disable_parallel_tool_use?}`; without it,
  `auto` (Anthropic's default when tools are given).
- Structured outputs: the generally available `output_config.format`, or the beta spelling
  `output_format`, accepted with the `anthropic-beta: structured-outputs-2025-11-13` header
  (as Anthropic still does during the transition); giving both is a 400.
"""

from __future__ import annotations

from collections.abc import Sequence

from sluice.api.anthropic.schema import CountTokensRequest, MessagesRequest, Tool, ToolChoice
from sluice.serving.errors import invalid
from sluice.serving.guided import OutputFormat
from sluice.serving.search_tool.domains import DomainRules
from sluice.tool_types import SearchToolUse, ToolChoiceMode, ToolSpec, search_tool_spec
from sluice.tool_types import ToolChoice as Choice

STRUCTURED_OUTPUTS_BETA = "structured-outputs-2025-11-13"


SEARCH_TOOL_TYPES = ("web_search_20250305", "web_search_20260209", "web_search_20260318")
SEARCH_TOOL_NAME = "web_search"  # the only name those types allow (the SDK's Literal)
_LOCATION_FIELDS = ("city", "region", "country", "timezone")
_SEARCH_IGNORED = ("defer_loading", "strict", "response_inclusion")  # no effect here


def search_tool(tools: Sequence[Tool] | None) -> SearchToolUse | None:
    """The declared search server tool, checked (None: the request declares none)."""
    found = [(i, t) for i, t in enumerate(tools or ()) if t.type in SEARCH_TOOL_TYPES]
    if not found:
        return None
    if len(found) > 1:
        raise invalid(f"tools.{found[1][0]}: the web search tool is declared twice")
    i, tool = found[0]
    where = f"tools.{i}"
    if tool.name != SEARCH_TOOL_NAME:
        raise invalid(f"{where}.name: Input should be '{SEARCH_TOOL_NAME}'")
    extra = dict(tool.model_extra or {})
    allowed, blocked = (
        _domains(extra.pop("allowed_domains", None), f"{where}.allowed_domains"),
        _domains(extra.pop("blocked_domains", None), f"{where}.blocked_domains"),
    )
    try:
        DomainRules.parse(allowed, blocked)
    except ValueError as exc:
        raise invalid(f"{where}: {exc}") from None
    _check_location(extra.pop("user_location", None), f"{where}.user_location")
    if tool.allowed_callers not in (None, ["direct"]):
        raise invalid(f"{where}.allowed_callers: only 'direct' is supported (no code execution runs here)")
    max_uses = extra.pop("max_uses", None)
    if max_uses is not None and (not isinstance(max_uses, int) or isinstance(max_uses, bool) or max_uses < 1):
        raise invalid(f"{where}.max_uses: Input should be an integer greater than or equal to 1")
    unknown = sorted(k for k in extra if k not in _SEARCH_IGNORED)
    if unknown or tool.input_schema is not None or tool.description is not None:
        key = unknown[0] if unknown else "input_schema" if tool.input_schema is not None else "description"
        raise invalid(f"{where}.{key}: Extra inputs are not permitted")
    return SearchToolUse(
        tool.name, max_uses, None if allowed is None else tuple(allowed), None if blocked is None else tuple(blocked)
    )


def _domains(value: object, where: str) -> list[str] | None:
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(d, str) for d in value):
        raise invalid(f"{where}: Input should be a list of strings")
    return value


def _check_location(value: object, where: str) -> None:
    """Anthropic's `{type: "approximate", city?, region?, country?, timezone?}`; accepted, unused."""
    if value is None:
        return
    if not isinstance(value, dict) or value.get("type") != "approximate":
        raise invalid(f"{where}.type: Input should be 'approximate'")
    for key, v in value.items():
        if key == "type":
            continue
        if key not in _LOCATION_FIELDS:
            raise invalid(f"{where}.{key}: Extra inputs are not permitted")
        if v is not None and not isinstance(v, str):
            raise invalid(f"{where}.{key}: Input should be a valid string")


def tool_specs(tools: Sequence[Tool] | None) -> list[ToolSpec]:
    """Every tool the model is offered: the client tools, and the search tool as one (in the
    order declared); the search tool is checked here too, so count_tokens refuses what
    /v1/messages refuses."""
    search_tool(tools)
    out: list[ToolSpec] = []
    for i, tool in enumerate(tools or ()):
        where = f"tools.{i}"
        if tool.type in SEARCH_TOOL_TYPES:
            out.append(search_tool_spec(tool.name))
            continue
        if tool.type not in (None, "custom"):
            raise invalid(
                f"{where}.type: server tool {tool.type!r} is not supported; only client tools (with an input_schema) "
                f"and the search tool ({SEARCH_TOOL_TYPES[0]}) are"
            )
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
        raise invalid(
            f"output_format: requires the 'anthropic-beta: {STRUCTURED_OUTPUTS_BETA}' header "
            "(or use output_config.format)"
        )
    if ga is not None and beta is not None:
        raise invalid("output_format: give either output_config.format or output_format, not both")
    fmt = ga or beta
    return None if fmt is None else OutputFormat(fmt.json_schema)
