"""A request's tools, tool_choice and output format → the grammar its reply is decoded under.

Wire formats reduce their fields to a `ToolChoice` (tool_types.py) and an
`OutputFormat`; the tools themselves travel in the `Conversation` (they are part of the
prompt). Here they become one `GuidedDecoding` spec, checked in full — structure, every schema,
the grammar library's own compile — before the request is queued, so an unsupported keyword is
a 400 naming it, never a stream that fails later or a silently unconstrained reply.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sluice.errors import InvalidRequestError
from sluice.models.grammar.compiler import check_guided
from sluice.models.tools.format import HERMES, ToolFormat, tool_format
from sluice.models.tools.guidance import json_object_guidance, json_schema_guidance, tool_guidance
from sluice.serving.errors import invalid
from sluice.serving.prompt import Conversation
from sluice.tool_types import ToolChoice, ToolChoiceMode
from sluice.types import GuidedDecoding, GuidedKind


@dataclass(slots=True, frozen=True)
class OutputFormat:
    """Structured output: the reply is JSON validating `schema`; None = any JSON object
    (OpenAI's json_object)."""

    schema: dict[str, Any] | None = None


# A spec that passed stays valid (it is frozen); a failure is not cached and is checked again.
_check = functools.lru_cache(maxsize=256)(check_guided)


@functools.lru_cache(maxsize=8)
def resolve_tool_format(setting: str) -> ToolFormat:
    """The `tool_format` setting: a registered format's name, or a JSON file of fields over Hermes."""
    if setting.endswith(".json"):
        try:
            return ToolFormat.from_dict(json.loads(Path(setting).read_text()), HERMES)
        except (OSError, ValueError, TypeError) as exc:
            raise ValueError(f"tool_format {setting}: {exc}") from None
    return tool_format(setting)


def guided_for(
    conv: Conversation, choice: ToolChoice, output: OutputFormat | None, fmt: ToolFormat
) -> GuidedDecoding | None:
    """The spec (None: unconstrained), checked; raises ServingError (400) naming the problem."""
    forced = choice.mode in (ToolChoiceMode.ANY, ToolChoiceMode.TOOL)
    if conv.prefill and (output is not None or forced):
        # the grammar starts where the reply starts; a prefill would put text before it
        raise invalid(
            "messages: a final assistant prefill cannot be combined with a structured output format "
            "or a forced tool_choice"
        )
    spec: GuidedDecoding | None
    try:
        if not conv.tools and output is not None and output.schema is None:
            spec = json_object_guidance()
        elif not conv.tools and output is not None and choice.mode in (ToolChoiceMode.AUTO, ToolChoiceMode.NONE):
            spec = json_schema_guidance(output.schema or {})
        else:
            schema = None if output is None else (output.schema if output.schema is not None else {"type": "object"})
            spec = tool_guidance(conv.tools, choice, fmt, schema)
        if spec is not None:
            _check(spec)
    except InvalidRequestError as exc:
        raise invalid(str(exc)) from None
    return spec


def parses_calls(spec: GuidedDecoding | None) -> bool:
    """Whether the reply may hold tool calls (and so goes through the call parser)."""
    return spec is not None and spec.kind is GuidedKind.TOOL_CALLS and spec.max_calls != 0
