"""The router's POST /v1/search answered inside uvicorn's HTTP protocol, before any ASGI.

Why: with the search itself made cheap, the largest part of the router's own CPU per query was
the way to it — uvicorn's ASGI machinery (a scope, a request-response cycle, receive and send
messages, the response written header by header) and starlette's Request around the front
(front.py). The shard's server met the same and answers its query requests from the parser's
callbacks (shard/query_protocol.py); the router does so here, on the same uvicorn base
(common/uvicorn_protocol.py).

What: a `POST` to exactly `/v1/search` over HTTP/1.1, with no `expect` and no upgrade, when
nothing else is in flight on the connection, is taken here, step by step as the parser reports
it, through the same functions as the ASGI paths (search_endpoint.py):
- at the headers: the key, checked in constant time (a refusal is a 401 before any of the body is
  read), and a declared `content-length` over the bound (a 413, before the body is read);
- as the body arrives (content-length or chunked; httptools decodes chunks): its size, refused
  with a 413 the moment it passes the bound;
- at its end: the body decoded through the contract (a 400 at once when it is wrong), then the
  search run, and its answer — already JSON bytes (SearchResponse.json_bytes) — written with
  one `transport.write`. The search is stepped right there, in the parser's callback: when it
  needs no waiting (every shard read in this process, tiers/local_reads.py, or an answer from
  the result cache) it is answered before the callback returns, with no task at all (a task,
  its registration and its callbacks were ~6 µs of the router's ~0.25 ms own CPU a query);
  when it waits on a shard, a task carries it on from where it stopped (`_Resume`).
Errors keep the API's one shape and status (responses.py; `connection: close` where it says so).

Keep-alive and ordering: the search in flight is the connection's current cycle for uvicorn's
protocol (`self.cycle`, duck-typed by `_Search`), so uvicorn's own code keeps working around it:
a request pipelined behind it (whatever its path) is queued by uvicorn and started when the
answer is written (`on_response_complete`, which also resumes reading and arms the keep-alive
timer), `shutdown` lets it finish and then closes, and a lost connection marks it disconnected.
(A search answered within the callback is complete before the parser reads what follows it, so
a search pipelined behind it is taken here too.) A client that disconnects mid-search cancels
nothing: the search runs to its end (it may share work with other queries) and its answer is
dropped. Before writing, the search waits for the transport's buffer to drain below its
high-water mark, as uvicorn's `send` does (then in a task, if it was stepping in the callback).

Everything else — other paths and methods, a query string, `expect: 100-continue`, an upgrade,
HTTP/1.0, a search pipelined behind a request still being answered, uvicorn's concurrency limit —
goes through uvicorn and the ASGI front (front.py) unchanged. Where the installed uvicorn's
protocol is not the one this was written against, `uvicorn_http_option` says so and the router
serves every request through the ASGI front.
"""

from __future__ import annotations

import logging
from collections.abc import Coroutine, Generator
from typing import Any

from starlette.datastructures import Headers

from sluice.common.uvicorn_protocol import AnsweredInside, http_option, httptools_protocol, json_response
from sluice.search.contract import MAX_SEARCH_BODY_BYTES, SearchRequest
from sluice.search.errors import SearchError
from sluice.search.router.http.request_body import declared_length, too_large
from sluice.search.router.http.responses import CLOSES, error_payload, internal_error
from sluice.search.router.http.search_endpoint import check_key, decode, searched
from sluice.search.router.runtime import RouterRuntime

log = logging.getLogger("sluice.search.router")
PATH = b"/v1/search"
WHAT = "a search body"


class _Search:
    """One POST /v1/search from its headers to its answer. uvicorn's protocol holds it as its
    current cycle and reads or sets these names on it (`response_complete`, `disconnected`,
    `keep_alive`, `message_event.set()`), as on its own RequestResponseCycle."""

    __slots__ = ("keep_alive", "response_complete", "disconnected", "message_event", "chunks", "size")

    def __init__(self, keep_alive: bool) -> None:
        self.keep_alive = keep_alive  # the client's wish; cleared by uvicorn's shutdown
        self.response_complete = False
        self.disconnected = False
        self.message_event = _NOBODY_WAITS  # uvicorn wakes its cycle's body reader; nothing waits here
        self.chunks: list[bytes] = []
        self.size = 0


class _NobodyWaits:
    """The `message_event` of every _Search: uvicorn calls its set(), and nothing waits on it.
    One shared object, not the search itself: a search holding itself is a reference cycle, two
    objects a request left to the cyclic collector (query_tree.py says why that costs)."""

    __slots__ = ()

    def set(self) -> None:
        pass


_NOBODY_WAITS = _NobodyWaits()


class _DefaultHeaders:
    """uvicorn's default headers (`date`, `server`) rendered once per list: its server replaces
    the list every second with the new date."""

    __slots__ = ("source", "rendered")

    def __init__(self) -> None:
        self.source: list[tuple[bytes, bytes]] | None = None
        self.rendered = b""

    def render(self, headers: list[tuple[bytes, bytes]]) -> bytes:
        if headers is not self.source:
            self.source, self.rendered = headers, b"".join(b"%s: %s\r\n" % (n, v) for n, v in headers)
        return self.rendered


class _Resume:
    """The rest of a coroutine already stepped once outside any task, awaited by the task that
    carries it on: what the first step waits on is handed to the task as the coroutine's own
    `await` would have, then every value and exception goes through to the coroutine."""

    __slots__ = ("coro", "step")

    def __init__(self, coro: Coroutine[Any, Any, None], step: Any) -> None:
        self.coro, self.step = coro, step

    def __await__(self) -> Generator[Any, Any, None]:
        coro, step = self.coro, self.step
        while True:
            try:
                sent = yield step
            except BaseException as exc:  # the task's cancellation, or the awaited future's error
                try:
                    step = coro.throw(exc)
                except StopIteration:
                    return
            else:
                try:
                    step = coro.send(sent)
                except StopIteration:
                    return


async def _resumed(coro: Coroutine[Any, Any, None], step: Any) -> None:
    await _Resume(coro, step)


def _started(protocol: Any, coro: Coroutine[Any, Any, None]) -> None:
    """`coro` run as far as it goes without waiting; if it waits, a task of uvicorn's protocol
    (its shutdown waits for them, as for its own) carries it on."""
    try:
        step = coro.send(None)
    except StopIteration:
        return  # done: every shard read in this process, or the result cache's answer
    task = protocol.loop.create_task(_resumed(coro, step))
    protocol.tasks.add(task)
    task.add_done_callback(protocol.tasks.discard)


def search_protocol_for(rt: RouterRuntime) -> type | None:
    """A protocol class for uvicorn's `http=` answering POST /v1/search for `rt`, or None when
    the installed uvicorn's httptools protocol is not the one this was written against."""
    HttpToolsProtocol = httptools_protocol()
    if HttpToolsProtocol is None:
        return None
    defaults = _DefaultHeaders()

    class RouterSearchProtocol(AnsweredInside, HttpToolsProtocol):  # type: ignore[misc, valid-type]
        def claim(self) -> _Search | None:
            if self.url != PATH or self.limit_concurrency is not None:
                return None
            search = _Search(self.parser.should_keep_alive())
            self.cycle = search  # uvicorn's protocol sees it as the request in flight
            try:
                check_key(rt, Headers(raw=self.headers))
                declared = declared_length(self.headers)
                if declared is not None and declared > MAX_SEARCH_BODY_BYTES:
                    raise too_large(WHAT, MAX_SEARCH_BODY_BYTES)
            except SearchError as err:
                self._refuse(search, err)
            return search

        def take(self, search: _Search, body: bytes) -> None:
            if search.response_complete:  # refused already: the rest is dropped with the connection
                return
            search.size += len(body)
            if search.size > MAX_SEARCH_BODY_BYTES:
                self._refuse(search, too_large(WHAT, MAX_SEARCH_BODY_BYTES))
                return
            search.chunks.append(body)

        def complete(self, search: _Search) -> None:
            if search.response_complete:
                return
            body = search.chunks[0] if len(search.chunks) == 1 else b"".join(search.chunks)
            search.chunks = []
            try:
                req = decode(rt, body)
            except SearchError as err:
                self._refuse(search, err)
                return
            _started(self, self._run(search, req))

        async def _run(self, search: _Search, req: SearchRequest) -> None:
            try:
                payload = await searched(rt, req)
            except SearchError as err:
                rt.metrics.refused(err.kind.value)
                status, payload, close = err.status, error_payload(err), err.kind in CLOSES
            except Exception:
                log.exception("POST /v1/search failed")
                fault = internal_error()
                rt.metrics.refused(fault.kind.value)
                status, payload, close = fault.status, error_payload(fault), True
            else:
                status, close = 200, False
            if self.flow.write_paused and not search.disconnected:
                await self.flow.drain()  # the client reads slowly: as uvicorn's send waits
            self._answer(search, status, payload, close)

        def _refuse(self, search: _Search, err: SearchError) -> None:
            rt.metrics.refused(err.kind.value)
            self._answer(search, err.status, error_payload(err), err.kind in CLOSES)

        def _answer(self, search: _Search, status: int, payload: bytes, close: bool) -> None:
            search.response_complete = True
            if search.disconnected or self.transport.is_closing():
                return  # nobody to answer
            keep_alive = search.keep_alive and not close
            self.transport.write(
                json_response(status, payload, keep_alive, defaults.render(self.server_state.default_headers))
            )
            if not keep_alive:
                self.transport.close()
            self.on_response_complete()  # uvicorn's: the next pipelined request, or the keep-alive timer

    return RouterSearchProtocol


def uvicorn_http_option(rt: RouterRuntime) -> dict[str, Any]:
    """The `http=` option for uvicorn.run: this protocol when it fits the installed uvicorn."""
    return http_option(search_protocol_for(rt), "sluice search router", "answering POST /v1/search inside the protocol")
