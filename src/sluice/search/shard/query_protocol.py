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

from sluice.common.uvicorn_protocol import http_option, httptools_protocol, json_response, plain_post
from sluice.search.shard.query_path import MAX_BODY_BYTES, TOO_LARGE_PAYLOAD, Handler, QueryPath


def query_protocol_for(query_path: QueryPath) -> type | None:
    """A protocol class for uvicorn's `http=` answering `query_path`'s requests, or None when
    the installed uvicorn's httptools protocol is not the one this was written against."""
    HttpToolsProtocol = httptools_protocol()
    if HttpToolsProtocol is None:
        return None
    handlers = {path.encode(): h for path, h in query_path.handlers.items()}

    class ShardQueryProtocol(HttpToolsProtocol):  # type: ignore[misc, valid-type]
        _query: Handler | None = None
        _query_body: list[bytes]
        _query_size = 0

        def on_message_begin(self) -> None:
            self._query = None
            super().on_message_begin()

        def on_headers_complete(self) -> None:
            handler = handlers.get(self.url)
            if handler is not None and plain_post(self):
                self._query, self._query_body, self._query_size = handler, [], 0
                return
            super().on_headers_complete()

        def on_body(self, body: bytes) -> None:
            if self._query is None:
                super().on_body(body)
                return
            self._query_size += len(body)
            if self._query_size <= MAX_BODY_BYTES:
                self._query_body.append(body)

        def on_message_complete(self) -> None:
            handler = self._query
            if handler is None:
                super().on_message_complete()
                return
            self._query = None
            if self._query_size > MAX_BODY_BYTES:
                status, payload = 413, TOO_LARGE_PAYLOAD
                keep_alive = False
            else:
                status, payload = query_path.answer(handler, b"".join(self._query_body))
                keep_alive = self.parser.should_keep_alive()
            self._query_body = []
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
