"""OpenAI `tools`, `tool_choice`, `parallel_tool_calls`, `response_format`, assistant
`tool_calls` and `role: "tool"` messages → serving's terms.

- tools: `[{"type": "function", "function": {name, description?, parameters?, strict?}}]`;
  missing `parameters` means "no arguments" (`{"type": "object", "properties": {}}`).
- tool_choice: "auto" (default with tools), "none", "required" (any tool), or
  `{"type": "function", "function": {"name": …}}`; `parallel_tool_calls: false` = at most one call.
- response_format: "text", "json_object" (any JSON object), or
  `{"type": "json_schema", "json_schema": {name, schema, strict?, description?}}`.
- An assistant message's `tool_calls` become tool calls (their `arguments` JSON text parsed); a
  run of `role: "tool"` messages becomes one user turn of tool results (one per call, in order).
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from sluice.api.anthropic.convert import describe_validation_error
from sluice.api.errors import bad_request
from sluice.serving.guided import OutputFormat
from sluice.tool_types import ToolCall, ToolChoice, ToolChoiceMode, ToolSpec

NO_ARGUMENTS = {"type": "object", "properties": {}}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class FunctionDef(_Strict):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class FunctionTool(_Strict):
    type: str
    function: FunctionDef


class NamedFunction(_Strict):
    name: str


class NamedChoice(_Strict):
    type: str
    function: NamedFunction


class JsonSchemaFormat(_Strict):
    model_config = ConfigDict(extra="forbid", strict=True, populate_by_name=True)
    name: str
    description: str | None = None
    json_schema: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None


class ResponseFormat(_Strict):
    type: str
    json_schema: JsonSchemaFormat | None = None


class CallFunction(BaseModel):
    model_config = ConfigDict(extra="allow")
    name: str
    arguments: str


class AssistantCall(BaseModel):
    model_config = ConfigDict(extra="allow")
    id: str
    type: str = "function"
    function: CallFunction


def _parse(model: type[BaseModel], data: Any, where: str) -> Any:
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        message = f"{where}.{describe_validation_error(exc)}".removesuffix(".body")
        raise bad_request(message, param=where) from None


def tool_specs(tools: list[dict[str, Any]] | None) -> list[ToolSpec]:
    out: list[ToolSpec] = []
    for i, raw in enumerate(tools or ()):
        tool: FunctionTool = _parse(FunctionTool, raw, f"tools.{i}")
        if tool.type != "function":
            raise bad_request(
                f"tools.{i}.type: only 'function' tools are supported, not {tool.type!r}", param=f"tools.{i}.type"
            )
        f = tool.function
        schema = NO_ARGUMENTS if f.parameters is None else f.parameters
        if schema.get("type") != "object":
            raise bad_request(
                f"tools.{i}.function.parameters: the parameters schema must have type 'object'",
                param=f"tools.{i}.function.parameters",
            )
        out.append(ToolSpec(f.name, schema, f.description or "", bool(f.strict)))
    return out


def tool_choice(raw: Any, parallel: bool | None) -> ToolChoice:
    single = parallel is False
    if raw is None or raw == "auto":
        return ToolChoice(ToolChoiceMode.AUTO, disable_parallel=single)
    if raw == "none":
        return ToolChoice(ToolChoiceMode.NONE)
    if raw == "required":
        return ToolChoice(ToolChoiceMode.ANY, disable_parallel=single)
    if isinstance(raw, dict):
        named: NamedChoice = _parse(NamedChoice, raw, "tool_choice")
        if named.type == "function":
            return ToolChoice(ToolChoiceMode.TOOL, named.function.name, disable_parallel=single)
    raise bad_request(
        'tool_choice: must be \'none\', \'auto\', \'required\' or {"type": "function", "function": {"name": …}}',
        param="tool_choice",
    )


def response_format(raw: dict[str, Any] | None) -> OutputFormat | None:
    if raw is None:
        return None
    fmt: ResponseFormat = _parse(ResponseFormat, raw, "response_format")
    if fmt.type == "text":
        return None
    if fmt.type == "json_object":
        return OutputFormat(None)
    if fmt.type == "json_schema":
        if fmt.json_schema is None:
            raise bad_request("response_format.json_schema: Field required", param="response_format.json_schema")
        return OutputFormat(fmt.json_schema.json_schema if fmt.json_schema.json_schema is not None else {})
    raise bad_request(
        f"response_format.type: must be 'text', 'json_object' or 'json_schema', not {fmt.type!r}",
        param="response_format.type",
    )


def assistant_calls(raw: list[dict[str, Any]], where: str) -> list[ToolCall]:
    out: list[ToolCall] = []
    for j, item in enumerate(raw):
        call: AssistantCall = _parse(AssistantCall, item, f"{where}.{j}")
        try:
            args = json.loads(call.function.arguments) if call.function.arguments.strip() else {}
        except ValueError:
            args = None
        if not isinstance(args, dict):
            raise bad_request(
                f"{where}.{j}.function.arguments: must be a JSON object", param=f"{where}.{j}.function.arguments"
            )
        out.append(ToolCall(call.id, call.function.name, args))
    return out
