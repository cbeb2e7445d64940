"""The shard's query requests (POST /v1/shard/stats and /v1/shard/search) answered in front of
FastAPI, as plain ASGI.

Every search makes two of these per shard, and measured under the same load a FastAPI route
(routing, the Request object, dependency solving, the response class) cost more CPU than the
index work it wraps; here a request is one JSON body in and one out. Everything else the shard
serves (writes, catch-up, snapshots, status, metrics) stays on FastAPI, where it is documented.
The handlers decode each body through the contract (search/contract.py). Errors keep the
shard's shape, `{"error": {"type", "message"}}`, with the status of their SearchErrorKind.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from starlette.types import ASGIApp, Receive, Scope, Send

from sluice.search import strict_json
from sluice.search.errors import DocumentError, QuerySyntaxError, SearchError, SearchErrorKind

Handler = Callable[[dict[str, Any]], dict[str, Any]]
MAX_BODY_BYTES = 16 << 20
MAX_DEPTH = 128  # a query tree is nested up to check_tree's 40 levels, two JSON arrays each
TOO_LARGE = SearchError(SearchErrorKind.TOO_LARGE, f"a query request is at most {MAX_BODY_BYTES} bytes")
TOO_LARGE_PAYLOAD = json.dumps(TOO_LARGE.body(), separators=(",", ":")).encode()


class QueryPath:
    def __init__(self, app: ASGIApp, handlers: dict[str, Handler], on_error: Callable[[str], None]):
        self.app, self.handlers, self.on_error = app, handlers, on_error

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        handler = self.handlers.get(scope.get("path", "")) if scope["type"] == "http" else None
        if handler is None or scope.get("method") != "POST":
            await self.app(scope, receive, send)
            return
        body, more = b"", True
        while more:
            msg = await receive()
            if msg["type"] == "http.disconnect":
                return
            body += msg.get("body", b"")
            more = msg.get("more_body", False)
            if len(body) > MAX_BODY_BYTES:
                await _answer(send, TOO_LARGE.status, TOO_LARGE.body())
                return
        await _send_json(send, *self.answer(handler, body))

    def answer(self, handler: Handler, body: bytes) -> tuple[int, bytes]:
        """One query request's body → (status, the JSON answer); shared with query_protocol.py."""
        try:
            data = strict_json.loads(body, MAX_DEPTH)
            if not isinstance(data, dict):
                raise DocumentError("the body must be a JSON object")
            return 200, json.dumps(handler(data), separators=(",", ":"), ensure_ascii=False).encode()
        except QuerySyntaxError as exc:
            self.on_error("bad_query")
            err = exc.as_search_error()
        except SearchError as exc:
            self.on_error("bad_request")
            err = exc
        except DocumentError as exc:
            self.on_error("bad_request")
            err = SearchError(SearchErrorKind.INVALID_REQUEST, str(exc))
        except (ValueError, TypeError, KeyError) as exc:  # malformed JSON or fields of the wrong shape
            self.on_error("bad_request")
            err = SearchError(SearchErrorKind.INVALID_REQUEST, f"invalid request: {exc}"[:500])
        return err.status, json.dumps(err.body(), separators=(",", ":")).encode()


async def _answer(send: Send, status: int, out: dict[str, Any]) -> None:
    await _send_json(send, status, json.dumps(out, separators=(",", ":"), ensure_ascii=False).encode())


async def _send_json(send: Send, status: int, payload: bytes) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": payload})
