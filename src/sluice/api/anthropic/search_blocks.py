"""The search tool's results ↔ Anthropic's `web_search_tool_result` blocks (reference §2.1, §3).

A hit is a `web_search_result` `{url, title, encrypted_content, page_age}`: `url` is the
result's source (the document's `url` field, else `sluice-search:<id>`), `title` its title,
`page_age` the document's `page_age` field (else null), and `encrypted_content` the text the
model read — the hit's snippet — base64 (URL-safe) of the UTF-8 text. It is NOT encrypted: it is
an opaque field the client sends back unchanged in a later turn, so the model reads the same
result again (the text is the fleet's own index content, already shown to this client's model).
A failed search is `{"type": "web_search_tool_result_error", "error_code": …}`.
"""

from __future__ import annotations

import base64
import binascii
from typing import Any

from sluice.api.anthropic.blocks import WebSearchResult, WebSearchToolResultBlock
from sluice.serving.errors import invalid
from sluice.serving.outcomes import ServerToolResult
from sluice.tool_types import SearchResult, ToolResult, search_tool_result


def encode_text(text: str) -> str:
    return base64.urlsafe_b64encode(text.encode()).decode("ascii")


def decode_text(data: str, where: str) -> str:
    try:
        return base64.b64decode(data.encode("ascii"), altchars=b"-_", validate=True).decode()
    except (binascii.Error, UnicodeError, ValueError):
        raise invalid(
            f"{where}: not a search result this server returned (send encrypted_content back unchanged)"
        ) from None


def result_block(result: ServerToolResult) -> dict[str, Any]:
    """The block a search call's result is in the reply (and in a stream's content_block_start)."""
    content: Any
    if result.error is not None:
        content = {"type": "web_search_tool_result_error", "error_code": result.error.value}
    else:
        content = [
            {
                "type": "web_search_result",
                "url": r.source,
                "title": r.title,
                "encrypted_content": encode_text(r.text),
                "page_age": r.page_age,
            }
            for r in result.results
        ]
    return {"type": "web_search_tool_result", "tool_use_id": result.tool_use_id, "content": content}


def _search_result(hit: WebSearchResult, where: str) -> SearchResult:
    return SearchResult(
        hit.url, hit.title, decode_text(hit.encrypted_content, f"{where}.encrypted_content"), hit.page_age
    )


def history_result(block: WebSearchToolResultBlock, where: str) -> ToolResult:
    """A result sent back in the conversation → the tool result the model reads (the same text
    the search tool gave it when the search ran)."""
    if not isinstance(block.content, list):
        return search_tool_result(block.tool_use_id, [], block.content.error_code)
    return search_tool_result(
        block.tool_use_id, [_search_result(h, f"{where}.content.{k}") for k, h in enumerate(block.content)]
    )
