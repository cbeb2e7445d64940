"""The shard's query requests answered inside uvicorn's HTTP protocol, before any ASGI.

Measured against one shard process, uvicorn's per-request machinery (the ASGI scope, a
request-response cycle, a task, two sends) cost ~150 µs of the shard's CPU for a statistics
request whose own work is a few µs, where a bare asyncio server over the same httptools parser
took ~80 µs; a search makes one or two such requests per shard. So the shard runs uvicorn with
this subclass of its httptools protocol: a `POST` to exactly `/v1/shard/stats` or
`/v1/shard/search` (HTTP/1.1, no `expect`, nothing else in flight on the connection) is answered
from the parser's callbacks — the same handler and the same JSON as the ASGI query path
(query_path.py `QueryPath.answer`) — and the connection then goes back to uvicorn's own
keep-alive handling (`on_response_complete`). Everything else, and any request this does not
take, goes through uvicorn unchanged.

It builds on uvicorn's HttpToolsProtocol internals (its parser callbacks, `url`, `cycle`,
`on_response_complete`), found through common/uvicorn_protocol.py as serving's protocol is: where
the installed uvicorn's differs, `query_protocol_for` returns None and the shard serves with
uvicorn's default protocol and the ASGI query path (tests/unit/search/test_fast_paths.py checks
that this protocol is the one in use; tests/unit/common/test_uvicorn_protocol.py the fallback).
"""

from __future__ import annotations

from typing import Any

from sluice.common.uvicorn_protocol import AnsweredInside, http_option, httptools_protocol, json_response
from sluice.search.shard.query_path import MAX_BODY_BYTES, TOO_LARGE_PAYLOAD, Handler, QueryPath


class _Query:
    """One query request from its headers to its answer: its handler and its body so far."""

    __slots__ = ("handler", "chunks", "size")

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.chunks: list[bytes] = []
        self.size = 0


def query_protocol_for(query_path: QueryPath) -> type | None:
    """A protocol class for uvicorn's `http=` answering `query_path`'s requests, or None when
    the installed uvicorn's httptools protocol is not the one this was written against."""
    HttpToolsProtocol = httptools_protocol()
    if HttpToolsProtocol is None:
        return None
    handlers = {path.encode(): h for path, h in query_path.handlers.items()}

    class ShardQueryProtocol(AnsweredInside, HttpToolsProtocol):  # type: ignore[misc, valid-type]
        def claim(self) -> _Query | None:
            handler = handlers.get(self.url)
            return None if handler is None else _Query(handler)

        def take(self, query: _Query, body: bytes) -> None:
            query.size += len(body)
            if query.size <= MAX_BODY_BYTES:
                query.chunks.append(body)

        def complete(self, query: _Query) -> None:
            if query.size > MAX_BODY_BYTES:
                status, payload = 413, TOO_LARGE_PAYLOAD
                keep_alive = False
            else:
                status, payload = query_path.answer(query.handler, b"".join(query.chunks))
                keep_alive = self.parser.should_keep_alive()
            self.transport.write(json_response(status, payload, keep_alive))
            if not keep_alive:
                self.transport.close()
                return
            self.on_response_complete()  # uvicorn's keep-alive timer and flow control, as after any answer

    return ShardQueryProtocol


def uvicorn_http_option(query_path: QueryPath) -> dict[str, Any]:
    """The `http=` option for uvicorn.run: this protocol when it fits the installed uvicorn."""
    return http_option(
        query_protocol_for(query_path), "sluice search shard", "answering query requests inside the protocol"
    )
