"""The router's POST /v1/search answered inside uvicorn's protocol (router/http/search_protocol.py):
a real uvicorn server in this process on 127.0.0.1, spoken to over raw sockets so that the
wire itself is checked — keep-alive, pipelined requests answered in order, refusals before the
body, `connection: close` where the API says so, a client gone mid-search — and that what the
protocol does not take still goes through the ASGI front. No shard listens (127.0.0.1:9): a
search is answered partial, or by an injected `rt.search`."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import asynccontextmanager
from typing import Any

import uvicorn

from sluice.search.router.config import parse_config

Reply = tuple[int, dict[str, str], Any]


def _runtime(extra: str = "") -> Any:
    from sluice.search.router.runtime import RouterRuntime

    cfg = parse_config(f'[search]\nmax_top_k = 50\n{extra}[[shards]]\nname = "a"\nreplicas = ["127.0.0.1:9"]\n')
    return RouterRuntime(cfg, [["http://127.0.0.1:9"]])


@asynccontextmanager
async def _server(rt: Any, taken: list[bytes], inline: list[bool] | None = None) -> AsyncIterator[int]:
    """uvicorn with the router's app and its search protocol; `taken` lists the bodies the
    protocol (not the ASGI front) answered, and `inline` whether each was answered before its
    parser callback returned (no task)."""
    from sluice.search.router.http.app import create_router_app
    from sluice.search.router.http.front import RouterFront
    from sluice.search.router.http.search_protocol import search_protocol_for

    protocol = search_protocol_for(rt)
    assert protocol is not None  # the installed uvicorn is the one it was written against

    class Counting(protocol):  # type: ignore[misc, valid-type]
        def complete(self, search: Any) -> None:
            if not search.response_complete:
                taken.append(b"".join(search.chunks))
            super().complete(search)
            if inline is not None:
                inline.append(search.response_complete)

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()  # a request sent before uvicorn accepts waits in the backlog
    config = uvicorn.Config(RouterFront(create_router_app(rt), rt), log_level="critical", http=Counting, lifespan="off")
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        yield sock.getsockname()[1]
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 60)


async def _reply(reader: asyncio.StreamReader) -> Reply:
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 60)
    lines = head.decode().split("\r\n")
    headers = dict(line.lower().split(": ", 1) for line in lines[1:] if line)
    body = await asyncio.wait_for(reader.readexactly(int(headers.get("content-length", "0"))), 60)
    return int(lines[0].split()[1]), headers, json.loads(body) if body else None


def _post(body: bytes, path: str = "/v1/search", extra: str = "") -> bytes:
    return f"POST {path} HTTP/1.1\r\nhost: x\r\ncontent-length: {len(body)}\r\n{extra}\r\n".encode() + body


def _run(test: Callable[[], Coroutine[Any, Any, None]]) -> None:
    asyncio.run(test())


def test_searches_on_one_connection_are_answered_by_the_protocol_in_order_with_the_apis_errors():
    rt, taken = _runtime(), []

    async def go() -> None:
        async with _server(rt, taken) as port:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            good = json.dumps({"query": "python", "top_k": 5}).encode()
            writer.write(_post(good))
            status, headers, got = await _reply(reader)
            assert status == 200 and got["partial"] is True and got["failed_shards"] == {"a": "unavailable"}
            assert headers["content-type"] == "application/json" and "connection" not in headers
            assert "date" in headers  # uvicorn's default headers, as on its own answers
            # pipelined in one write: a search, a bad one, a route of FastAPI's, a syntax error
            writer.write(
                _post(good)
                + _post(b'{"query": "a", "top_k": 51}')
                + b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n"
                + _post(b'{"query": "(python"}')
            )
            replies = [await _reply(reader) for _ in range(4)]
            assert [r[0] for r in replies] == [200, 400, 200, 400]
            assert replies[1][2]["error"]["type"] == "invalid_request_error"
            assert "top_k is at most 50" in replies[1][2]["error"]["message"]
            assert replies[2][2] == {"status": "ok"}
            assert replies[3][2]["error"] == {
                "type": "query_syntax_error",
                "message": replies[3][2]["error"]["message"],
                "position": 0,
            }
            writer.write(_post(b"not json", extra="connection: close\r\n"))  # still on the same connection
            status, headers, got = await _reply(reader)
            assert (
                status == 400 and headers["connection"] == "close" and got["error"]["type"] == "invalid_request_error"
            )
            assert await asyncio.wait_for(reader.read(), 60) == b""  # closed as asked
            writer.close()
        # the protocol's: the first, the first of the pipelined ones and the last; those pipelined
        # behind a search in flight were queued by uvicorn (and answered by the ASGI front)
        assert taken[:2] == [good, good] and taken[-1] == b"not json"

    _run(go)


def test_a_bad_key_and_a_declared_oversized_body_are_refused_before_the_body_is_sent():
    rt = _runtime('api_keys = ["k-12345678"]\n')

    async def go() -> None:
        async with _server(rt, []) as port:
            for head, status, kind in [
                (b"content-length: 100\r\n", 401, "authentication_error"),
                (b"x-api-key: k-12345678\r\ncontent-length: 70000\r\n", 413, "request_too_large"),
            ]:
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
                writer.write(b"POST /v1/search HTTP/1.1\r\nhost: x\r\n" + head + b"\r\n")  # no body, ever
                got, headers, err = await _reply(reader)
                assert (got, headers["connection"], err["error"]["type"]) == (status, "close", kind)
                writer.close()
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(_post(b'{"query": "a"}', extra="authorization: Bearer k-12345678\r\n"))
            assert (await _reply(reader))[0] == 200
            writer.close()

    _run(go)


def test_a_chunked_body_is_read_and_bounded_as_it_arrives():
    rt = _runtime()

    def chunk(data: bytes) -> bytes:
        return b"%x\r\n%s\r\n" % (len(data), data)

    async def go() -> None:
        async with _server(rt, []) as port:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            head = b"POST /v1/search HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n"
            writer.write(head + chunk(b'{"query": ') + chunk(b'"python"}') + b"0\r\n\r\n")
            assert (await _reply(reader))[0] == 200
            writer.write(head + chunk(b" " * 40000) + chunk(b" " * 40000))  # past 64 KiB, never ended
            status, headers, err = await _reply(reader)
            assert (status, headers["connection"], err["error"]["type"]) == (413, "close", "request_too_large")
            writer.close()

    _run(go)


def test_what_the_protocol_does_not_take_goes_through_the_asgi_front():
    rt, taken = _runtime(), []

    async def go() -> None:
        async with _server(rt, taken) as port:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            body = b'{"query": "python"}'
            writer.write(_post(body, extra="expect: 100-continue\r\n"))
            assert await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 60) == b"HTTP/1.1 100 Continue\r\n\r\n"
            assert (await _reply(reader))[0] == 200
            writer.write(_post(body, path="/v1/search?x=1"))
            assert (await _reply(reader))[0] == 200
            writer.write(b"GET /v1/search HTTP/1.1\r\nhost: x\r\n\r\n")
            status, _, err = await _reply(reader)
            assert status == 405 and err["error"]["type"] == "method_not_allowed_error"
            writer.close()
        assert taken == []

    _run(go)


def test_a_client_gone_mid_search_cancels_nothing_and_a_fault_is_a_500_that_closes():
    rt = _runtime()
    real_search = rt.search
    arrived, release, finished = asyncio.Event(), asyncio.Event(), []

    async def held_search(req: Any) -> Any:
        if req.query == "hold":
            arrived.set()
            await release.wait()
            finished.append(req.query)
        if req.query == "fail":
            raise RuntimeError("injected")
        return await real_search(req)

    rt.search = held_search

    async def go() -> None:
        async with _server(rt, []) as port:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(_post(b'{"query": "hold"}'))
            await asyncio.wait_for(arrived.wait(), 60)
            writer.close()  # gone before the answer
            await writer.wait_closed()
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(_post(b'{"query": "fail"}'))
            status, headers, err = await _reply(reader)
            assert (status, headers["connection"], err["error"]["type"]) == (500, "close", "api_error")
            assert "injected" not in err["error"]["message"]
            writer.close()
            release.set()
            for _ in range(600):  # the held search runs to its end: nothing cancelled it
                if finished:
                    break
                await asyncio.sleep(0.1)
            assert finished == ["hold"]
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(_post(b'{"query": "python"}'))
            assert (await _reply(reader))[0] == 200
            writer.close()

    _run(go)


def test_a_search_that_needs_no_waiting_is_answered_in_its_callback_and_one_that_waits_by_a_task(tmp_path):
    """Every shard read in this process (local reads): the search is answered before the parser's
    callback returns, no task made for it; searches pipelined behind it are then taken by the
    protocol too, answered in order. A search that waits (here on an event) is carried on by a
    task from where it stopped, and answers as the same search would have."""
    from tests import corpus
    from tests.local_search_router import local_router

    rt, taken, inline = local_router(corpus.documents(200), tmp_path), [], []
    real_search, release = rt.search, asyncio.Event()

    async def maybe_held(req: Any) -> Any:
        if req.query == "held python":
            await release.wait()
        return await real_search(req)

    rt.search = maybe_held
    queries = ["python library", "web server", "python library", "graph*"]

    async def go() -> None:
        async with _server(rt, taken, inline) as port:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"".join(_post(json.dumps({"query": q}).encode()) for q in queries))
            replies = [await _reply(reader) for _ in queries]
            assert [r[0] for r in replies] == [200] * 4 and all(r[2]["partial"] is False for r in replies)
            assert [r[2]["cached"] for r in replies] == [False, False, True, False]
            assert replies[0][2]["hits"] and replies[0][2]["hits"] == replies[2][2]["hits"]
            writer.write(_post(b'{"query": "held python"}'))
            for _ in range(600):
                if len(inline) == len(queries) + 1:
                    break
                await asyncio.sleep(0.05)
            release.set()
            status, _, held = await _reply(reader)
            writer.write(_post(b'{"query": "held python"}'))  # again: the result cache's answer
            again = (await _reply(reader))[2]
            assert status == 200 and held["hits"] and (held["cached"], again["cached"]) == (False, True)
            assert held["hits"] == again["hits"]
            writer.close()

    try:
        _run(go)
    finally:
        rt.local_reads.close()
    assert len(taken) == len(queries) + 2  # every one the protocol's, the pipelined ones included
    assert inline == [True] * len(queries) + [False, True]
