"""Chat turns with tools, calls and results → plain text turns for the model's chat template.

Tool support lives in the text, not the template: the tool list joins the system prompt, a
tool call is its family's call spelling, a tool result its family's result block. Any
ChatML-style template (the bundled SmolLM2's included) then renders plain role/content turns.

Two ways in, the same text out:
- `render_turns` does a whole conversation (→ `[{role, content}]` for `Tokenizer.render_chat`);
- `part_text` + `system_text` do it part by part, for a caller that keeps its own per-part
  structure (the serving layer's Conversation, with cache markers per part). Parts of one turn
  are joined with a blank line, the serving layer's rule.

`check_tool_pairs` is the check both wire formats require: every tool result answers a call of
the assistant turn right before it, and every call of an assistant turn is answered in the next
turn (unless that assistant turn ends the conversation, a prefill).
"""

from __future__ import annotations

from collections.abc import Sequence

from sluice.errors import InvalidRequestError
from sluice.models.tools.format import ToolFormat
from sluice.tool_types import ChatTurn, Part, Role, ToolCall, ToolResult, ToolSpec

PART_JOIN = "\n\n"


def check_tool_pairs(turns: Sequence[ChatTurn]) -> None:
    """Raise InvalidRequestError for an unanswered call or a result without its call."""
    pending: set[str] = set()  # tool_use ids of the previous assistant turn
    for i, turn in enumerate(turns):
        answered = {p.tool_use_id for p in turn.parts if isinstance(p, ToolResult)}
        stray = sorted(answered - pending)
        if stray:
            raise InvalidRequestError(
                f"messages.{i}: tool_result for tool_use id {stray[0]!r}, "
                "which the previous assistant turn does not contain"
            )
        if pending and turn.role is not Role.ASSISTANT and pending - answered:
            raise InvalidRequestError(
                f"messages.{i}: tool_use ids were found without tool_result blocks immediately after: "
                + ", ".join(sorted(pending - answered))
            )
        if turn.role is Role.ASSISTANT:
            pending = {p.id for p in turn.parts if isinstance(p, ToolCall)}
        elif turn.role is Role.USER:
            pending = set()


def part_text(part: Part, fmt: ToolFormat) -> str:
    """One part as prompt text: text as is, a call in the family's call spelling, a result as
    the family's result block."""
    if isinstance(part, ToolCall):
        return fmt.render_call(part)
    if isinstance(part, ToolResult):
        return fmt.render_result(part.content, part.is_error)
    return part


def system_text(system: str, tools: Sequence[ToolSpec], fmt: ToolFormat) -> str:
    """The system prompt with the tool list (the family's preamble) after it."""
    return PART_JOIN.join(s for s in (system, fmt.render_tools(list(tools)) if tools else "") if s)


def render_turns(
    turns: Sequence[ChatTurn], tools: Sequence[ToolSpec], fmt: ToolFormat, system: str = ""
) -> list[dict[str, str]]:
    """The template's input: the system prompt (+ the tool list), then each turn as text.
    Results move to a turn of `fmt.result_role` when that differs from the turn's own role."""
    check_tool_pairs(turns)
    out: list[dict[str, str]] = []
    head = system_text(system, tools, fmt)
    if head:
        out.append({"role": Role.SYSTEM.value, "content": head})
    for turn in turns:
        results = [p for p in turn.parts if isinstance(p, ToolResult)]
        if results and fmt.result_role is not turn.role:
            out.append({"role": fmt.result_role.value, "content": PART_JOIN.join(part_text(p, fmt) for p in results)})
            rest = [p for p in turn.parts if not isinstance(p, ToolResult)]
            if rest:
                out.append({"role": turn.role.value, "content": PART_JOIN.join(part_text(p, fmt) for p in rest)})
            continue
        out.append({"role": turn.role.value, "content": PART_JOIN.join(part_text(p, fmt) for p in turn.parts)})
    return out
