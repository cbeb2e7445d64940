"""Pure ASGI middleware (no BaseHTTPMiddleware: it would buffer SSE streams).

`RequestContextMiddleware` gives every HTTP request a `req_…` id (scope state + `request-id`
response header) and enforces the request body size limit *before* the app sees the body:
a declared or actual body over the limit is answered 413, and a body that does not arrive within
`body_timeout_s` 408, both in the route's error shape.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from opentelemetry.trace import Span, SpanKind
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from sluice.api.errors import ApiError, is_openai_path
from sluice.api.ids import new_id
from sluice.request_context import request_id_var
from sluice.trace_context import tracer


def error_response(err: ApiError, path: str, request_id: str | None) -> JSONResponse:
    body = err.openai_body() if is_openai_path(path) else err.anthropic_body(request_id)
    headers = dict(err.headers)
    if request_id:
        headers["request-id"] = request_id
    return JSONResponse(body, status_code=err.status, headers=headers)


class RequestContextMiddleware:
    def __init__(
        self,
        app: ASGIApp,
        max_body_bytes: int,
        on_response: Callable[[Scope, int, list[tuple[bytes, bytes]]], None] | None = None,
        body_timeout_s: float = 60.0,
    ):
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.body_timeout_s = body_timeout_s  # headers complete → whole body: else 408
        self.on_response = on_response  # sees every response's status and headers (metrics)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request_id = new_id("req")
        scope.setdefault("state", {})["request_id"] = request_id
        token = request_id_var.set(request_id)  # every log line of this request carries it
        # a message's id is not part of the span's name (one name per route, not per message)
        path = "/v1/messages/{id}" if scope["path"].startswith("/v1/messages/msg") else scope["path"]
        name = f"{scope['method']} {path}"
        with tracer().start_as_current_span(name, kind=SpanKind.SERVER) as span:
            span.set_attribute("http.request.method", scope["method"])
            span.set_attribute("sluice.request_id", request_id)
            try:
                await self._handle(scope, receive, send, request_id, span)
            finally:
                request_id_var.reset(token)

    async def _handle(self, scope: Scope, receive: Receive, send: Send, request_id: str, span: Span) -> None:
        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                span.set_attribute("http.response.status_code", message["status"])
                headers = [(k, v) for k, v in message.get("headers", []) if k.lower() != b"request-id"]
                headers.append((b"request-id", request_id.encode()))
                message = {**message, "headers": headers}
                if self.on_response is not None:
                    self.on_response(scope, message["status"], headers)
            await send(message)

        too_large = ApiError(
            413, f"request body is larger than the {self.max_body_bytes}-byte limit", type="request_too_large"
        )
        declared = _content_length(scope)
        if declared is not None and declared > self.max_body_bytes:
            await error_response(too_large, scope["path"], request_id)(scope, receive, send_with_id)
            return
        if scope["method"] in ("POST", "PUT", "PATCH"):
            try:
                async with asyncio.timeout(self.body_timeout_s):
                    body, disconnected = await _read_body(receive, self.max_body_bytes)
            except TimeoutError:
                slow = ApiError(
                    408,
                    f"the request body did not arrive within {self.body_timeout_s:g}s",
                    headers={"connection": "close"},
                )
                await error_response(slow, scope["path"], request_id)(scope, receive, send_with_id)
                return
            if body is None:
                if not disconnected:
                    await error_response(too_large, scope["path"], request_id)(scope, receive, send_with_id)
                return
            receive = _replay(body, receive)
        await self.app(scope, receive, send_with_id)


def _content_length(scope: Scope) -> int | None:
    for key, value in scope.get("headers", []):
        if key == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


async def _read_body(receive: Receive, limit: int) -> tuple[bytes | None, bool]:
    """The whole body, or (None, disconnected) when it passes `limit` or the client left."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None, True
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            return None, False
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks), False


def _replay(body: bytes, receive: Receive) -> Receive:
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()  # after the body: disconnect notifications, as usual

    return replay
