"""How tools, calls and results are spelled in a model family's prompt and output.

The bundled SmolLM2's chat template has no tool support, so sluice defines the format: the
Hermes / Qwen2.5 convention most open chat models were tuned on (ChatML turns, the tool list in
the system prompt as JSON lines inside <tools></tools>, each call a JSON object
{"name": …, "arguments": …} inside <tool_call></tool_call>, results inside
<tool_response></tool_response> in a user turn). The preamble wording is sluice's own.

Every field is overridable: `ToolFormat.from_dict` (e.g. a JSON file's content) starts from a
registered format and replaces the fields given; `register_format` adds a family.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any

from sluice.errors import InvalidRequestError
from sluice.tool_types import Role, ToolCall, ToolSpec
from sluice.types import CallSyntax

HERMES_PREAMBLE = (
    "# Tools\n\n"
    "You can call functions to help answer. Their signatures, one JSON object per line:\n"
    "<tools>\n{tools}\n</tools>\n\n"
    "To call a function, write a JSON object with its name and arguments between <tool_call> and "
    "</tool_call> tags, one call per tag pair:\n"
    '<tool_call>\n{{"name": <function-name>, "arguments": <arguments-json-object>}}\n</tool_call>'
)


@dataclass(slots=True, frozen=True)
class ToolFormat:
    name: str
    preamble: str = HERMES_PREAMBLE  # str.format template; {tools} = one JSON line per tool
    trigger: str = "<tool_call>"  # what opens a call; free text never contains it
    call_open: str = "<tool_call>\n"  # starts with trigger
    call_close: str = "\n</tool_call>"
    name_key: str = "name"
    arguments_key: str = "arguments"
    call_separator: str = "\n"  # between parallel calls
    result_role: Role = Role.USER  # the turn tool results are rendered in
    result_open: str = "<tool_response>\n"
    result_close: str = "\n</tool_response>"
    error_prefix: str = "Error: "  # before an is_error result's text

    def __post_init__(self) -> None:
        if not self.trigger or not self.call_open.startswith(self.trigger):
            raise ValueError(f"tool format {self.name!r}: call_open must start with the trigger")

    @classmethod
    def from_dict(cls, data: dict[str, Any], base: ToolFormat | None = None) -> ToolFormat:
        """`base` (default: Hermes) with the fields in `data` replaced; unknown fields are an error."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown tool format field(s): {', '.join(unknown)}")
        values = dict(data)
        if "result_role" in values:
            values["result_role"] = Role(values["result_role"])
        return dataclasses.replace(base or HERMES, **values)

    # -- output side: what the grammar enforces and the parser reads ------------------------
    def call_syntax(self) -> CallSyntax:
        """The call spelling as the engine's grammar sees it: json.dumps' layout of
        {name_key: NAME, arguments_key: ARGS}."""
        return CallSyntax(
            trigger=self.trigger,
            begin=self.call_open + "{" + json.dumps(self.name_key) + ': "',
            middle='", ' + json.dumps(self.arguments_key) + ": ",
            end="}" + self.call_close,
            separator=self.call_separator,
        )

    def render_call(self, call: ToolCall) -> str:
        body = json.dumps({self.name_key: call.name, self.arguments_key: call.input}, ensure_ascii=False)
        return self.call_open + body + self.call_close

    # -- prompt side ---------------------------------------------------------------------------
    def render_tools(self, tools: list[ToolSpec]) -> str:
        lines = [
            json.dumps(
                {
                    "type": "function",
                    "function": {"name": t.name, "description": t.description, "parameters": t.input_schema},
                },
                ensure_ascii=False,
            )
            for t in tools
        ]
        return self.preamble.format(tools="\n".join(lines))

    def render_result(self, content: str, is_error: bool) -> str:
        return self.result_open + (self.error_prefix if is_error else "") + content + self.result_close


HERMES = ToolFormat(name="hermes")
_FORMATS: dict[str, ToolFormat] = {"hermes": HERMES}
# Model architecture → format. Every family we run is served through ChatML-style templates
# here, so all map to Hermes until a family needs its own (register_format + this table).
_FAMILY_DEFAULT: dict[str, str] = {"llama": "hermes", "qwen2": "hermes", "mistral": "hermes"}


def register_format(fmt: ToolFormat, families: tuple[str, ...] = ()) -> None:
    _FORMATS[fmt.name] = fmt
    for family in families:
        _FAMILY_DEFAULT[family] = fmt.name


def tool_format(name: str) -> ToolFormat:
    try:
        return _FORMATS[name]
    except KeyError:
        raise InvalidRequestError(f"unknown tool format {name!r}; known: {', '.join(sorted(_FORMATS))}") from None


def format_for_family(architecture: str) -> ToolFormat:
    """The tool format for a model architecture (ModelConfig.architecture); Hermes if unknown."""
    return _FORMATS[_FAMILY_DEFAULT.get(architecture, "hermes")]
