"""Chat turns with tools, calls and results → [{role, content}] for the model's chat template.

Tool support lives in the text, not the template: the tool list joins the system prompt, an
assistant turn's calls are appended to its text in the family's call spelling, tool results
become the family's result blocks in a `result_role` turn. Any ChatML-style template (the
bundled SmolLM2's included) then renders plain role/content turns.

Checks (both wire formats require them, so they are made here once): every tool result answers
a call of the assistant turn right before it, and every call of an assistant turn is answered in
the next turn (unless that assistant turn ends the conversation, a prefill).
"""

from __future__ import annotations

from collections.abc import Sequence

from sluice.errors import InvalidRequestError
from sluice.models.tools.format import ToolFormat
from sluice.models.tools.spec import ChatTurn, Role, ToolCall, ToolResult, ToolSpec


def _check_pairs(turns: Sequence[ChatTurn]) -> None:
    pending: dict[str, str] = {}  # tool_use id → name, from the previous assistant turn
    for i, turn in enumerate(turns):
        results = [p for p in turn.parts if isinstance(p, ToolResult)]
        for r in results:
            if r.tool_use_id not in pending:
                raise InvalidRequestError(
                    f"messages.{i}: tool_result for tool_use id {r.tool_use_id!r}, which the previous "
                    "assistant turn does not contain"
                )
        if pending and turn.role is not Role.ASSISTANT:
            missing = sorted(set(pending) - {r.tool_use_id for r in results})
            if missing:
                raise InvalidRequestError(
                    f"messages.{i}: tool_use ids were found without tool_result blocks immediately after: "
                    + ", ".join(missing)
                )
        if turn.role is Role.ASSISTANT:
            pending = {p.id: p.name for p in turn.parts if isinstance(p, ToolCall)}
        elif turn.role is Role.USER:
            pending = {}


def _assistant_text(turn: ChatTurn, fmt: ToolFormat) -> str:
    texts = [p for p in turn.parts if isinstance(p, str)]
    calls = [fmt.render_call(p) for p in turn.parts if isinstance(p, ToolCall)]
    head = "\n\n".join(texts)
    tail = fmt.call_separator.join(calls)
    return head + ("\n" if head and tail else "") + tail


def render_turns(
    turns: Sequence[ChatTurn], tools: Sequence[ToolSpec], fmt: ToolFormat, system: str = ""
) -> list[dict[str, str]]:
    """The template's input: the system prompt (+ the tool list), then each turn as text."""
    _check_pairs(turns)
    out: list[dict[str, str]] = []
    system_text = "\n\n".join(s for s in (system, fmt.render_tools(list(tools)) if tools else "") if s)
    if system_text:
        out.append({"role": Role.SYSTEM.value, "content": system_text})
    for turn in turns:
        if turn.role is Role.ASSISTANT:
            out.append({"role": Role.ASSISTANT.value, "content": _assistant_text(turn, fmt)})
            continue
        results = [fmt.render_result(p.content, p.is_error) for p in turn.parts if isinstance(p, ToolResult)]
        texts = [p for p in turn.parts if isinstance(p, str)]
        if results and fmt.result_role is not turn.role:  # results get their own turn
            out.append({"role": fmt.result_role.value, "content": "\n".join(results)})
            if texts:
                out.append({"role": turn.role.value, "content": "\n\n".join(texts)})
            continue
        body = "\n".join(results) + ("\n\n" if results and texts else "") + "\n\n".join(texts)
        out.append({"role": turn.role.value, "content": body})
    return out
