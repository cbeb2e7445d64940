"""Request bodies read up to a bound, and refused the moment they pass it.

A body is never read whole before its size is judged: a declared `content-length` over the
bound is refused before any of it is read, and a chunked body as soon as the bytes received
pass the bound. The answer then carries `connection: close` (responses.py), so the server
drops the rest of the upload instead of reading it to find the next request.
"""

from __future__ import annotations

from collections.abc import Iterable

from starlette.types import Receive

from sluice.search.errors import SearchError, SearchErrorKind


def too_large(what: str, limit: int) -> SearchError:
    return SearchError(SearchErrorKind.TOO_LARGE, f"{what} is at most {limit} bytes")


def declared_length(headers: Iterable[tuple[bytes, bytes]]) -> int | None:
    for name, value in headers:
        if name == b"content-length":
            return int(value) if value.isdigit() else None
    return None


async def read_bounded(headers: Iterable[tuple[bytes, bytes]], receive: Receive, limit: int, what: str) -> bytes:
    """The whole body when it is at most `limit` bytes; else SearchError(TOO_LARGE) as soon as
    that is known. A client gone mid-body is an invalid request (nobody reads the answer)."""
    declared = declared_length(headers)
    if declared is not None and declared > limit:
        raise too_large(what, limit)
    chunks: list[bytes] = []
    size = 0
    while True:
        msg = await receive()
        if msg["type"] != "http.request":
            raise SearchError(SearchErrorKind.INVALID_REQUEST, "the client disconnected before the body ended")
        chunk = msg.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise too_large(what, limit)
        chunks.append(chunk)
        if not msg.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)
