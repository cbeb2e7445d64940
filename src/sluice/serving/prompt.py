"""A conversation, in no wire format's shape, and how it becomes prompt token ids.

Each wire format (api/anthropic, api/openai) turns its messages into a `Conversation`: turns
of text parts, an optional assistant prefill, and which parts carry a prompt-cache marker.
Everything after that is shared: the model's chat template, tokenization, where the cached
prefix ends, what the input safety rules read.

Decisions:
- the parts of one turn are joined with a blank line;
- a prefill is appended after the template's generation prompt, so the reply continues it;
- a cache breakpoint is found by rendering the conversation up to the marked part and taking
  the longest common token prefix with the full prompt (templates differ; this needs no
  knowledge of any one of them).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from sluice.models.tokenizer import Tokenizer


class Role(str, enum.Enum):
    SYSTEM = "system"
    USER = "user"
    ASSISTANT = "assistant"


@dataclass(slots=True)
class Turn:
    role: Role
    parts: list[str]
    marked: list[bool] = field(default_factory=list)  # per part: carries a cache marker

    def __post_init__(self) -> None:
        if not self.marked:
            self.marked = [False] * len(self.parts)


@dataclass(slots=True)
class Conversation:
    turns: list[Turn]
    prefill: str = ""  # assistant text the reply continues (not repeated in the output)
    cache_whole_prompt: bool = False  # a request-level cache marker: the whole prompt is the prefix

    def safety_texts(self) -> list[str]:
        """What the input rules read: every non-assistant part (system prompt, user turns and the
        tool results inside them), not the assistant's own earlier words."""
        return [p for t in self.turns if t.role is not Role.ASSISTANT for p in t.parts if p]


@dataclass(slots=True)
class BuiltPrompt:
    token_ids: list[int]
    cache_breakpoint: int | None  # prompt tokens covered by the last cache marker


def _chat(turns: list[Turn]) -> list[dict[str, str]]:
    return [{"role": t.role.value, "content": "\n\n".join(t.parts)} for t in turns]


def build_prompt(conv: Conversation, tokenizer: Tokenizer) -> BuiltPrompt:
    text = tokenizer.render_chat(_chat(conv.turns), add_generation_prompt=True) + conv.prefill
    ids = tokenizer.encode(text)
    return BuiltPrompt(ids, _breakpoint(conv, ids, tokenizer))


def _breakpoint(conv: Conversation, ids: list[int], tokenizer: Tokenizer) -> int | None:
    if conv.cache_whole_prompt:
        return len(ids)
    marks = [(ti, pi) for ti, t in enumerate(conv.turns) for pi, m in enumerate(t.marked) if m]
    if not marks:
        return None
    ti, pi = marks[-1]
    head = [Turn(t.role, list(t.parts)) for t in conv.turns[:ti]]
    head.append(Turn(conv.turns[ti].role, conv.turns[ti].parts[: pi + 1]))
    partial = tokenizer.encode(tokenizer.render_chat(_chat(head), add_generation_prompt=False))
    n = 0
    for a, b in zip(partial, ids):
        if a != b:
            break
        n += 1
    return n
