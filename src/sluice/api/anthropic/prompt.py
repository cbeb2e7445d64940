"""Anthropic messages → a wire-neutral `Conversation` (serving/prompt.py renders it).

Decisions (documented in docs/API.md):
- consecutive turns with the same role are merged (Anthropic merges them too);
- a final assistant turn is a prefill: the reply continues its text, which is not repeated;
- tool_use blocks are rendered as JSON text and tool_result blocks as their text, so a
  text-only model still sees the exchange;
- image and document blocks are rejected with a clear 400: the served models read text only;
- thinking blocks are dropped (earlier reasoning is not replayed to the model);
- `cache_control` markers are kept per part, so the cached prefix can be located in tokens.
"""

from __future__ import annotations

import json
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
from sluice.serving.errors import invalid
from sluice.serving.prompt import Conversation, Role, Turn

MAX_CACHE_BREAKPOINTS = 4


def _block_text(block: Any, where: str) -> str | None:
    if isinstance(block, TextBlock):
        if block.text == "":
            raise invalid(f"{where}: text content blocks must be non-empty")
        return block.text
    if isinstance(block, (ImageBlock, DocumentBlock)):
        raise invalid(f"{where}: {block.type} blocks are not supported: the served model reads text only")
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
        return None
    return None


def _turns(messages: list[Message]) -> list[Turn]:
    if not messages:
        raise invalid("messages: at least one message is required")
    turns: list[Turn] = []
    last = len(messages) - 1
    for i, msg in enumerate(messages):
        where = f"messages.{i}.content"
        if isinstance(msg.content, str):
            if msg.content == "" and not (i == last and msg.role == "assistant"):
                raise invalid(f"{where}: text content blocks must be non-empty")
            parts, marked = [msg.content], [False]
        else:
            if not msg.content and not (i == last and msg.role == "assistant"):
                raise invalid(f"{where}: content must not be an empty list")
            parts, marked = [], []
            for j, block in enumerate(msg.content):
                text = _block_text(block, f"{where}.{j}")
                if text is not None:
                    parts.append(text)
                    marked.append(getattr(block, "cache_control", None) is not None)
        role = Role(msg.role)
        if turns and turns[-1].role is role:
            turns[-1].parts.extend(parts)
            turns[-1].marked.extend(marked)
        else:
            turns.append(Turn(role, parts, marked))
    return turns


def _system(system: str | list[TextBlock] | None) -> Turn | None:
    if system is None:
        return None
    if isinstance(system, str):
        return Turn(Role.SYSTEM, [system]) if system else None
    parts = [_block_text(b, f"system.{i}") or "" for i, b in enumerate(system)]
    return Turn(Role.SYSTEM, parts, [b.cache_control is not None for b in system]) if parts else None


def to_conversation(req: MessagesRequest | CountTokensRequest) -> Conversation:
    turns = _turns(req.messages)
    system = _system(req.system)
    if system is not None:
        turns.insert(0, system)
    marks = sum(m for t in turns for m in t.marked)
    if marks > MAX_CACHE_BREAKPOINTS:
        raise invalid(f"A maximum of {MAX_CACHE_BREAKPOINTS} blocks with cache_control may be provided. Found {marks}.")
    prefill = ""
    if turns[-1].role is Role.ASSISTANT:
        prefill = "\n\n".join(turns.pop().parts)
        if prefill != prefill.rstrip():
            raise invalid("messages: final assistant content cannot end with trailing whitespace")
        if not turns:
            raise invalid("messages: a conversation cannot consist of an assistant prefill only")
    return Conversation(turns, prefill, cache_whole_prompt=req.cache_control is not None)
