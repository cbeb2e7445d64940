"""Anthropic messages → the model's chat template → prompt token ids.

Decisions (documented in docs/API.md):
- consecutive turns with the same role are merged (Anthropic merges them too);
- a final assistant turn is a prefill: the reply continues its text, which is not repeated;
- text blocks of one turn are joined with a blank line; tool_use blocks are rendered as JSON
  text and tool_result blocks as their text, so a text-only model still sees the exchange;
- image and document blocks are rejected with a clear 400: the served models read text only;
- `cache_control` breakpoints are located as token positions, for honest prompt-cache usage.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from sluice.api.anthropic.schema import (
    CountTokensRequest,
    DocumentBlock,
    ImageBlock,
    Message,
    MessagesRequest,
    RedactedThinkingBlock,
    SearchResultBlock,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolUseBlock,
)
from sluice.api.errors import bad_request
from sluice.models.tokenizer import Tokenizer

MAX_CACHE_BREAKPOINTS = 4


@dataclass(slots=True)
class BuiltPrompt:
    token_ids: list[int]
    prefill: str  # assistant prefill text ("" when none)
    cache_breakpoint: int | None  # prompt tokens covered by the last cache_control marker


@dataclass(slots=True)
class _Turn:
    role: str
    parts: list[str]
    marked: list[bool]  # per part: carries cache_control


def _block_text(block: Any, where: str) -> str | None:
    if isinstance(block, TextBlock):
        if block.text == "":
            raise bad_request(f"{where}: text content blocks must be non-empty")
        return block.text
    if isinstance(block, (ImageBlock, DocumentBlock)):
        raise bad_request(f"{where}: {block.type} blocks are not supported: the served model reads text only")
    if isinstance(block, ToolUseBlock):
        return json.dumps({"tool_use": {"id": block.id, "name": block.name, "input": block.input}})
    if isinstance(block, ToolResultBlock):
        if isinstance(block.content, str) or block.content is None:
            return block.content or ""
        texts = [_block_text(b, where) for b in block.content]
        return "\n".join(t for t in texts if t)
    if isinstance(block, SearchResultBlock):
        extra = block.model_extra or {}
        return str(extra.get("title", "")) + "\n" + json.dumps(extra.get("content", ""))
    if isinstance(block, (ThinkingBlock, RedactedThinkingBlock)):
        return None  # earlier reasoning is not replayed to the model
    return None


def _turns(messages: list[Message]) -> list[_Turn]:
    if not messages:
        raise bad_request("messages: at least one message is required")
    turns: list[_Turn] = []
    last = len(messages) - 1
    for i, msg in enumerate(messages):
        where = f"messages.{i}.content"
        if isinstance(msg.content, str):
            if msg.content == "" and not (i == last and msg.role == "assistant"):
                raise bad_request(f"{where}: text content blocks must be non-empty")
            parts, marked = [msg.content], [False]
        else:
            if not msg.content and not (i == last and msg.role == "assistant"):
                raise bad_request(f"{where}: content must not be an empty list")
            parts, marked = [], []
            for j, block in enumerate(msg.content):
                text = _block_text(block, f"{where}.{j}")
                if text is not None:
                    parts.append(text)
                    marked.append(getattr(block, "cache_control", None) is not None)
        if turns and turns[-1].role == msg.role:
            turns[-1].parts.extend(parts)
            turns[-1].marked.extend(marked)
        else:
            turns.append(_Turn(msg.role, parts, marked))
    return turns


def _system(system: str | list[TextBlock] | None) -> _Turn | None:
    if system is None:
        return None
    if isinstance(system, str):
        return _Turn("system", [system], [False]) if system else None
    parts = [_block_text(b, f"system.{i}") or "" for i, b in enumerate(system)]
    return _Turn("system", parts, [b.cache_control is not None for b in system]) if parts else None


def _chat(turns: list[_Turn]) -> list[dict[str, str]]:
    return [{"role": t.role, "content": "\n\n".join(t.parts)} for t in turns]


def build_prompt(req: MessagesRequest | CountTokensRequest, tokenizer: Tokenizer) -> BuiltPrompt:
    turns = _turns(req.messages)
    system = _system(req.system)
    if system is not None:
        turns.insert(0, system)
    prefill = ""
    if turns[-1].role == "assistant":
        prefill = "\n\n".join(turns.pop().parts)
        if prefill != prefill.rstrip():
            raise bad_request("messages: final assistant content cannot end with trailing whitespace")
        if not turns:
            raise bad_request("messages: a conversation cannot consist of an assistant prefill only")
    text = tokenizer.render_chat(_chat(turns), add_generation_prompt=True) + prefill
    ids = tokenizer.encode(text)
    return BuiltPrompt(ids, prefill, _breakpoint(req, turns, ids, tokenizer))


def _breakpoint(req: Any, turns: list[_Turn], ids: list[int], tokenizer: Tokenizer) -> int | None:
    """Token position of the last cache_control marker (prefix order: system, then messages).

    The conversation is rendered up to and including the marked block; the longest common
    token prefix with the full prompt is where the cached prefix ends.
    """
    marks = [(ti, pi) for ti, t in enumerate(turns) for pi, m in enumerate(t.marked) if m]
    if len(marks) > MAX_CACHE_BREAKPOINTS:
        raise bad_request(f"A maximum of {MAX_CACHE_BREAKPOINTS} blocks with cache_control may be provided. Found {len(marks)}.")
    if getattr(req, "cache_control", None) is not None:
        return len(ids)  # automatic placement: the whole prompt is the cacheable prefix
    if not marks:
        return None
    ti, pi = marks[-1]
    head = [_Turn(t.role, list(t.parts), []) for t in turns[:ti]]
    head.append(_Turn(turns[ti].role, turns[ti].parts[: pi + 1], []))
    partial = tokenizer.encode(tokenizer.render_chat(_chat(head), add_generation_prompt=False))
    n = 0
    for a, b in zip(partial, ids):
        if a != b:
            break
        n += 1
    return n


def safety_texts(req: MessagesRequest) -> list[str]:
    """What the input rules read: the system prompt, user (and mid-conversation system) turns,
    and tool results — not the assistant's own earlier turns."""
    texts: list[str] = []
    system = _system(req.system)
    if system is not None:
        texts.extend(system.parts)
    for msg in req.messages:
        if msg.role == "assistant":
            continue
        if isinstance(msg.content, str):
            texts.append(msg.content)
            continue
        for block in msg.content:
            if isinstance(block, TextBlock):
                texts.append(block.text)
            elif isinstance(block, ToolResultBlock):
                texts.append(_block_text(block, "tool_result") or "")
    return [t for t in texts if t]
