"""POST /v1/search answered in front of FastAPI when the request is well formed.

Measured under one load, FastAPI's handling of a search (routing, the request model, dependency
solving, the response class) cost the router about as much CPU as the whole two-phase fan-out
over 2 shards. So a plain ASGI layer answers the common case itself: a JSON object with exactly
`query` (a string up to MAX_QUERY_CHARS) and optionally `top_k` (an integer from MIN_TOP_K to
max_top_k), and a permitted key — the request model's own bounds, imported from
router/search_request.py. Anything else — a missing or extra field, a wrong type, a bound
crossed, a refused key — is handed to the FastAPI route unchanged (the body replayed), so every
error keeps the one shape and message the API documents; the only error answered here is a
query syntax error, in the same shape the app gives it.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.requests import Request

from sluice.search.errors import QuerySyntaxError
from sluice.search.router.runtime import RouterRuntime
from sluice.search.router.search_request import DEFAULT_TOP_K, MAX_QUERY_CHARS, MIN_TOP_K, SEARCH_FIELDS

Receive = Callable[[], Awaitable[dict]]
Send = Callable[[dict], Awaitable[None]]
MAX_FAST_BODY = 64 << 10


class SearchFastPath:
    def __init__(self, app: Callable[[dict, Receive, Send], Awaitable[None]], rt: RouterRuntime):
        self.app, self.rt = app, rt

    async def __call__(self, scope: dict, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("path") != "/v1/search" or scope.get("method") != "POST":
            await self.app(scope, receive, send)
            return
        body, more, messages = b"", True, []
        while more and len(body) <= MAX_FAST_BODY:
            msg = await receive()
            messages.append(msg)
            if msg["type"] != "http.request":
                break
            body += msg.get("body", b"")
            more = msg.get("more_body", False)
        req = None if more else self._well_formed(scope, body)
        if req is None:
            await self.app(scope, _replay(messages, receive), send)
            return
        try:
            result = await self.rt.searcher.search(*req)
        except QuerySyntaxError as exc:
            await _answer(send, 400, {"error": {"type": "query_syntax_error", "message": str(exc),
                                                "position": exc.position}})
            return
        await _answer(send, 200, result.to_json())

    def _well_formed(self, scope: dict, body: bytes) -> tuple[str, int] | None:
        try:
            data = json.loads(body)
        except ValueError:
            return None
        if not isinstance(data, dict) or not set(data) <= SEARCH_FIELDS:
            return None
        query, top_k = data.get("query"), data.get("top_k", DEFAULT_TOP_K)
        if not isinstance(query, str) or len(query) > MAX_QUERY_CHARS:
            return None
        if type(top_k) is not int or not MIN_TOP_K <= top_k <= self.rt.cfg.search.max_top_k:
            return None
        if not self.rt.auth.may_search(Request(scope)):
            return None
        return query, top_k


def _replay(messages: list[dict], receive: Receive) -> Receive:
    pending = list(messages)

    async def again() -> dict:
        return pending.pop(0) if pending else await receive()

    return again


async def _answer(send: Send, status: int, out: dict[str, Any]) -> None:
    payload = json.dumps(out, separators=(",", ":"), ensure_ascii=False).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]})
    await send({"type": "http.response.body", "body": payload})
