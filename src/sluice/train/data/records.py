"""One JSONL line → one training example, or a problem naming what is wrong with the line.

Two shapes, told apart by their keys:
- chat: the Messages API's request shape, `{"system"?: str | [text blocks], "messages": [...]}`,
  each message `{"role": "user" | "assistant", "content": str | [text blocks]}`. The loss falls
  on the assistant turns only; a line without one has nothing to learn and is refused.
- text: `{"text": str}`, a plain document; the loss falls on every token.
Other content blocks (images, tool use) are refused with the line's number: a text model
cannot learn from them, and dropping them silently would change what the line means.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

ROLES = ("user", "assistant")


@dataclass(frozen=True, slots=True)
class ChatExample:
    messages: tuple[dict[str, str], ...]  # {"role", "content"} with a leading system message if any


@dataclass(frozen=True, slots=True)
class TextExample:
    text: str


Example = ChatExample | TextExample


def _text_of(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for i, block in enumerate(content):
            if not isinstance(block, dict) or block.get("type") != "text" or not isinstance(block.get("text"), str):
                kind = block.get("type") if isinstance(block, dict) else type(block).__name__
                raise ValueError(f"{where}[{i}]: only text blocks can be trained on, got {kind!r}")
            parts.append(block["text"])
        return "".join(parts)
    raise ValueError(f"{where}: must be a string or a list of text blocks")


def parse_record(line: str) -> Example:
    """The example on one line; ValueError says what is wrong with it."""
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not valid JSON ({exc.msg} at column {exc.colno})") from None
    if not isinstance(obj, dict):
        raise ValueError("a line must be a JSON object")
    if "messages" in obj:
        unknown = set(obj) - {"messages", "system"}
        if unknown:
            raise ValueError(f"unknown keys {sorted(unknown)} (a chat line has messages and optionally system)")
        messages = obj["messages"]
        if not isinstance(messages, list) or not messages:
            raise ValueError("messages must be a non-empty list")
        out: list[dict[str, str]] = []
        if obj.get("system") is not None:
            out.append({"role": "system", "content": _text_of(obj["system"], "system")})
        for i, m in enumerate(messages):
            if not isinstance(m, dict) or m.get("role") not in ROLES:
                raise ValueError(f"messages[{i}]: role must be one of {', '.join(ROLES)}")
            out.append({"role": m["role"], "content": _text_of(m.get("content"), f"messages[{i}].content")})
        if not any(m["role"] == "assistant" for m in out):
            raise ValueError("no assistant message: nothing to learn from this line")
        return ChatExample(tuple(out))
    if "text" in obj:
        if set(obj) != {"text"}:
            raise ValueError(f"unknown keys {sorted(set(obj) - {'text'})} (a text line has only text)")
        if not isinstance(obj["text"], str) or not obj["text"]:
            raise ValueError("text must be a non-empty string")
        return TextExample(obj["text"])
    raise ValueError('a line needs "messages" (chat) or "text" (plain text)')
