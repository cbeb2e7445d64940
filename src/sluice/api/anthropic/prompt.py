"""Anthropic messages → a wire-neutral `Conversation` (serving/prompt.py renders it).

Decisions (documented in docs/API.md):
- consecutive turns with the same role are merged (Anthropic merges them too);
- a final assistant turn is a prefill: the reply continues its text, which is not repeated;
- tool_use and tool_result blocks become tool calls and results (the model family's tool
  format spells them in the prompt, serving/prompt.py); a tool_result's content list is its
  text blocks joined by newlines; every tool_use must be answered by a tool_result in the next
  user turn and every tool_result must answer one (400 otherwise, as Anthropic does);
- the tools are part of the conversation (they are rendered into the prompt and counted);
- image and document blocks are rejected with a clear 400: the served models read text only;
- the search tool's blocks are its calls and results: a `server_tool_use` named `web_search` is
  a call, a `web_search_tool_result` (in the assistant turn, where the reply put it) is its
  result, moved to a user turn of its own right after the call (where the tool format puts a
  result: the model reads the conversation as it read it when the search ran);
- blocks of other server tools (web_fetch_tool_result, …, container_upload) and the browser
  toolset's browser_state are a 400 naming the block: none of those tools runs here;
- thinking blocks are dropped (earlier reasoning is not replayed to the model), and so are
  tool_reference blocks in a tool result (every tool is in the prompt already);
- the fields a local model cannot use are ignored: a call's `caller` and `toolset_name`,
  `citations`, an image's `transformations`;
- `cache_control` markers are kept per part, so the cached prefix can be located in tokens.
"""

from __future__ import annotations

from typing import Any

from sluice.api.anthropic.blocks import (
    SERVER_TOOL_BLOCKS,
    BrowserStateBlock,
    DocumentBlock,
    ImageBlock,
    RedactedThinkingBlock,
    SearchResultBlock,
    ServerToolUseBlock,
    TextBlock,
    ThinkingBlock,
    ToolReferenceBlock,
    ToolResultBlock,
    ToolUseBlock,
    WebSearchToolResultBlock,
)
from sluice.api.anthropic.schema import CountTokensRequest, Message, MessagesRequest
from sluice.api.anthropic.search_blocks import history_result
from sluice.api.anthropic.tools import SEARCH_TOOL_NAME, tool_specs
from sluice.errors import InvalidRequestError
from sluice.serving.errors import invalid
from sluice.serving.prompt import Conversation, Role, Turn
from sluice.tool_types import Part, SearchResult, ToolCall, ToolResult

MAX_CACHE_BREAKPOINTS = 4


def _block_part(block: Any, where: str) -> Part | None:
    if isinstance(block, ToolUseBlock):
        return ToolCall(block.id, block.name, block.input)
    if isinstance(block, ToolResultBlock):
        return ToolResult(block.tool_use_id, _block_text(block, where) or "", bool(block.is_error))
    if isinstance(block, ServerToolUseBlock) and block.name == SEARCH_TOOL_NAME:
        return ToolCall(block.id, block.name, block.input)
    if isinstance(block, WebSearchToolResultBlock):
        return history_result(block, where)
    return _block_text(block, where)


def _block_text(block: Any, where: str) -> str | None:
    if isinstance(block, TextBlock):
        if block.text == "":
            raise invalid(f"{where}: text content blocks must be non-empty")
        return block.text
    if isinstance(block, (ImageBlock, DocumentBlock)):
        raise invalid(f"{where}: {block.type} blocks are not supported: the served model reads text only")
    if isinstance(block, ToolResultBlock):
        if isinstance(block.content, str) or block.content is None:
            return block.content or ""
        texts = [_block_text(b, f"{where}.content.{k}") for k, b in enumerate(block.content)]
        return "\n".join(t for t in texts if t)
    if isinstance(block, SearchResultBlock):
        passages = [_block_text(b, f"{where}.content.{k}") or "" for k, b in enumerate(block.content)]
        return SearchResult(block.source, block.title, "\n".join(passages)).render()
    if isinstance(block, (ThinkingBlock, RedactedThinkingBlock, ToolReferenceBlock)):
        return None
    if isinstance(block, ServerToolUseBlock):
        raise invalid(
            f"{where}: server_tool_use of {block.name!r} is not supported: "
            f"the only server tool here is {SEARCH_TOOL_NAME!r}"
        )
    if isinstance(block, SERVER_TOOL_BLOCKS):
        raise invalid(
            f"{where}: {block.type} blocks are not supported: no server tool but {SEARCH_TOOL_NAME!r} runs here"
        )
    if isinstance(block, BrowserStateBlock):
        raise invalid(f"{where}: browser_state blocks are not supported: the browser toolset is not offered here")
    return None


def _turns(messages: list[Message]) -> list[Turn]:
    if not messages:
        raise invalid("messages: at least one message is required")
    turns: list[Turn] = []

    def add(role: Role, part: Part, marked: bool) -> None:  # consecutive same-role parts: one turn
        if turns and turns[-1].role is role:
            turns[-1].parts.append(part)
            turns[-1].marked.append(marked)
        else:
            turns.append(Turn(role, [part], [marked]))

    last = len(messages) - 1
    for i, msg in enumerate(messages):
        where = f"messages.{i}.content"
        role = Role(msg.role)
        if isinstance(msg.content, str):
            if msg.content == "" and not (i == last and msg.role == "assistant"):
                raise invalid(f"{where}: text content blocks must be non-empty")
            add(role, msg.content, False)
            continue
        if not msg.content and not (i == last and msg.role == "assistant"):
            raise invalid(f"{where}: content must not be an empty list")
        before = (len(turns), len(turns[-1].parts) if turns else 0)
        for j, block in enumerate(msg.content):
            part = _block_part(block, f"{where}.{j}")
            if part is not None:
                # a search result answers the call before it: a user turn of its own
                add(
                    Role.USER if isinstance(block, WebSearchToolResultBlock) else role,
                    part,
                    getattr(block, "cache_control", None) is not None,
                )
        if before == (len(turns), len(turns[-1].parts) if turns else 0) and not (turns and turns[-1].role is role):
            turns.append(Turn(role, []))  # nothing to read (thinking only, an empty prefill): the turn stays
    return turns


def _system(system: str | list[TextBlock] | None) -> Turn | None:
    if system is None:
        return None
    if isinstance(system, str):
        return Turn(Role.SYSTEM, [system]) if system else None
    parts: list[Part] = [_block_text(b, f"system.{i}") or "" for i, b in enumerate(system)]
    return Turn(Role.SYSTEM, parts, [b.cache_control is not None for b in system]) if parts else None


def to_conversation(req: MessagesRequest | CountTokensRequest) -> Conversation:
    turns = _turns(req.messages)
    try:
        Conversation(turns).check_tool_pairs()
    except InvalidRequestError as exc:
        raise invalid(str(exc)) from None
    system = _system(req.system)
    if system is not None:
        turns.insert(0, system)
    marks = sum(m for t in turns for m in t.marked)
    if marks > MAX_CACHE_BREAKPOINTS:
        raise invalid(f"A maximum of {MAX_CACHE_BREAKPOINTS} blocks with cache_control may be provided. Found {marks}.")
    prefill = ""
    if turns[-1].role is Role.ASSISTANT:
        last = turns.pop().parts
        if not all(isinstance(p, str) for p in last):
            raise invalid("messages: a final assistant prefill can hold text only, not tool_use blocks")
        prefill = "\n\n".join(p for p in last if isinstance(p, str))
        if prefill != prefill.rstrip():
            raise invalid("messages: final assistant content cannot end with trailing whitespace")
        if not turns:
            raise invalid("messages: a conversation cannot consist of an assistant prefill only")
    return Conversation(turns, prefill, cache_whole_prompt=req.cache_control is not None, tools=tool_specs(req.tools))
