"""A conversation, in no wire format's shape, and how it becomes prompt token ids.

Each wire format (api/anthropic, api/openai) turns its messages into a `Conversation`: turns
of parts (text, tool calls, tool results), the tools offered, an optional assistant prefill,
and which parts carry a prompt-cache marker. Everything after that is shared: the tool format
of the model family, the model's chat template, tokenization, where the cached prefix ends,
what the input safety rules read.

Decisions:
- the parts of one turn are joined with a blank line (models/tools/render.py PART_JOIN);
- tools, calls and results are spelled by the tool format (models/tools/format.py): the tool
  list after the system prompt (a system turn is added when there is none), a call in the
  family's call spelling, a result as its result block in the turn it came in;
- a prefill is appended after the template's generation prompt, so the reply continues it;
- a cache breakpoint is found by rendering the conversation up to the marked part and taking
  the longest common token prefix with the full prompt (templates differ; this needs no
  knowledge of any one of them).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sluice.models.tokenizer import Tokenizer
from sluice.models.tools.format import HERMES, ToolFormat
from sluice.models.tools.render import PART_JOIN, check_tool_pairs, part_text, system_text
from sluice.tool_types import ChatTurn, Part, Role, ToolResult, ToolSpec

__all__ = ["BuiltPrompt", "Conversation", "Role", "Turn", "build_prompt"]


@dataclass(slots=True)
class Turn:
    role: Role
    parts: list[Part]
    marked: list[bool] = field(default_factory=list)  # per part: carries a cache marker

    def __post_init__(self) -> None:
        if not self.marked:
            self.marked = [False] * len(self.parts)


@dataclass(slots=True)
class Conversation:
    turns: list[Turn]
    prefill: str = ""  # assistant text the reply continues (not repeated in the output)
    cache_whole_prompt: bool = False  # a request-level cache marker: the whole prompt is the prefix
    tools: list[ToolSpec] = field(default_factory=list)  # offered to the model (in the prompt)

    def safety_texts(self) -> list[str]:
        """What the input rules read: every non-assistant part (system prompt, user turns and the
        tool results inside them), not the assistant's own earlier words or calls."""
        out: list[str] = []
        for t in self.turns:
            if t.role is Role.ASSISTANT:
                continue
            for p in t.parts:
                text = p.content if isinstance(p, ToolResult) else p if isinstance(p, str) else ""
                if text:
                    out.append(text)
        return out

    def check_tool_pairs(self) -> None:
        """Every tool result answers a call of the assistant turn before it, every call is
        answered in the next turn (InvalidRequestError otherwise)."""
        check_tool_pairs([ChatTurn(t.role, t.parts) for t in self.turns])


@dataclass(slots=True)
class BuiltPrompt:
    token_ids: list[int]
    cache_breakpoint: int | None  # prompt tokens covered by the last cache marker


def _chat(turns: list[Turn], tools: list[ToolSpec], fmt: ToolFormat) -> list[dict[str, str]]:
    out = [{"role": t.role.value, "content": PART_JOIN.join(part_text(p, fmt) for p in t.parts)} for t in turns]
    if tools:
        if out and turns[0].role is Role.SYSTEM:
            out[0]["content"] = system_text(out[0]["content"], tools, fmt)
        else:
            out.insert(0, {"role": Role.SYSTEM.value, "content": system_text("", tools, fmt)})
    return out


def build_prompt(conv: Conversation, tokenizer: Tokenizer, fmt: ToolFormat = HERMES) -> BuiltPrompt:
    text = tokenizer.render_chat(_chat(conv.turns, conv.tools, fmt), add_generation_prompt=True) + conv.prefill
    ids = tokenizer.encode(text)
    return BuiltPrompt(ids, _breakpoint(conv, ids, tokenizer, fmt))


def _breakpoint(conv: Conversation, ids: list[int], tokenizer: Tokenizer, fmt: ToolFormat) -> int | None:
    if conv.cache_whole_prompt:
        return len(ids)
    marks = [(ti, pi) for ti, t in enumerate(conv.turns) for pi, m in enumerate(t.marked) if m]
    if not marks:
        return None
    ti, pi = marks[-1]
    head = [Turn(t.role, list(t.parts)) for t in conv.turns[:ti]]
    head.append(Turn(conv.turns[ti].role, conv.turns[ti].parts[: pi + 1]))
    partial = tokenizer.encode(tokenizer.render_chat(_chat(head, conv.tools, fmt), add_generation_prompt=False))
    n = 0
    for a, b in zip(partial, ids):
        if a != b:
            break
        n += 1
    return n
