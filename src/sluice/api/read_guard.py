"""Limits on reading a request, so slow or hostile clients cannot hold connections forever.

uvicorn bounds none of this: a client that sends half its headers, or an 8 MB header, or opens
hundreds of connections and trickles bytes, would each hold a socket (and memory) indefinitely.
The protocol (connection_watch.py) consults a `ReadGuard`:

- `header_timeout_s`: from a connection's opening (or the first byte of its next request on a
  kept-alive connection) until the request's headers are complete → else 408, connection closed;
- `max_header_bytes`: request line + headers; more → 431 before the rest is even buffered;
- `max_incomplete_requests`: connections whose current request is not fully read yet (headers
  or body); a new connection beyond that is refused at once with 503.
The body's own deadline (`body_timeout_s`) is enforced where the body is read (middleware.py),
which answers 408 in the route's error shape.

Responses written here bypass the app (there is no request to route yet), so they are rendered
as raw HTTP/1.1 with the same JSON error shapes as every other error.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field

from sluice.api.errors import ApiError, is_openai_path
from sluice.api.ids import new_id


@dataclass(slots=True, frozen=True)
class ReadLimits:
    header_timeout_s: float = 10.0
    max_header_bytes: int = 64 * 1024
    max_incomplete_requests: int = 256


@dataclass
class ReadGuard:
    limits: ReadLimits = field(default_factory=ReadLimits)
    incomplete: set[object] = field(default_factory=set)  # protocols reading a request
    on_refuse: Callable[[int], None] | None = None  # sees each refusal's status (metrics)

    def full(self) -> bool:
        return len(self.incomplete) >= self.limits.max_incomplete_requests

    def count(self, status: int) -> None:
        if self.on_refuse is not None:
            self.on_refuse(status)


def raw_error_response(status: int, message: str, url: bytes = b"") -> bytes:
    """A complete `Connection: close` HTTP/1.1 response carrying the API's JSON error body."""
    err = ApiError(status, message)
    request_id = new_id("req")
    path = url.split(b"?", 1)[0].decode("latin-1")
    body = err.openai_body() if is_openai_path(path) else err.anthropic_body(request_id)
    payload = json.dumps(body, separators=(",", ":")).encode()
    reason = {408: "Request Timeout", 431: "Request Header Fields Too Large", 503: "Service Unavailable"}.get(
        status, "Error"
    )
    head = (
        f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\ncontent-length: {len(payload)}\r\n"
        f"request-id: {request_id}\r\nx-should-retry: {'false' if status == 431 else 'true'}\r\n"
        "connection: close\r\n\r\n"
    )
    return head.encode("latin-1") + payload
