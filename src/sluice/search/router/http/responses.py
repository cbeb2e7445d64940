"""The router's answers as bytes, for the FastAPI routes and the ASGI front alike.

An error is `{"error": {"type", "message", ...}}` with the status of its kind (errors.py). Some
kinds also close the connection (`connection: close`): those answered before the body was read
— its size over the bound, no valid key, a write to a query-only router — so the server drops
the rest of the upload instead of reading it to find the next request, and an internal error
(after which the server drops the connection; saying so lets a client that reuses connections
open a new one instead of meeting a reset).
"""

from __future__ import annotations

import json
from typing import Any

from starlette.responses import Response
from starlette.types import Send

from sluice.search.errors import SearchError, SearchErrorKind

CLOSES = frozenset(
    {SearchErrorKind.TOO_LARGE, SearchErrorKind.AUTHENTICATION, SearchErrorKind.QUERY_ONLY, SearchErrorKind.INTERNAL}
)
JSON = b"application/json"


def encode(out: Any) -> bytes:
    return json.dumps(out, separators=(",", ":"), ensure_ascii=False).encode()


def error_payload(err: SearchError) -> bytes:
    # ASCII escapes: a message may quote what the client sent, which must never fail to encode
    return json.dumps(err.body(), separators=(",", ":")).encode()


def error_headers(err: SearchError) -> dict[str, str]:
    return {"connection": "close"} if err.kind in CLOSES else {}


def error_response(err: SearchError) -> Response:
    return Response(
        error_payload(err), status_code=err.status, media_type="application/json", headers=error_headers(err)
    )


def internal_error() -> SearchError:
    return SearchError(SearchErrorKind.INTERNAL, "internal error (the router's log has the details)")


async def send_json(send: Send, status: int, payload: bytes, close: bool = False) -> None:
    headers = [(b"content-type", JSON), (b"content-length", str(len(payload)).encode())]
    if close:
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": payload})


async def send_error(send: Send, err: SearchError) -> None:
    await send_json(send, err.status, error_payload(err), err.kind in CLOSES)
