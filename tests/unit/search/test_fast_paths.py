"""The query path's plain-ASGI layers: well-formed requests are answered there, everything else
falls through to FastAPI with the documented error shapes (no servers: nothing listens on the
shard address, so a search is answered partial)."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI
from fastapi.testclient import TestClient

from sluice.search.router.config import parse_config
from sluice.search.shard.query_path import QueryPath

if TYPE_CHECKING:
    from aiohttp import web


def _router(extra: str = "") -> TestClient:
    from sluice.search.router.http.app import create_router_app
    from sluice.search.router.http.front import RouterFront
    from sluice.search.router.runtime import RouterRuntime

    cfg = parse_config(f'[search]\nmax_top_k = 50\n{extra}[[shards]]\nname = "a"\nreplicas = ["127.0.0.1:9"]\n')
    rt = RouterRuntime(cfg, [["http://127.0.0.1:9"]])
    return TestClient(RouterFront(create_router_app(rt), rt))  # its own loop per request: the
    # shard client opens a session in each (cluster/shard_query_client.py)


def test_a_well_formed_search_is_answered_and_errors_keep_their_shapes():
    client = _router()
    r = client.post("/v1/search", json={"query": "python", "top_k": 5})
    assert r.status_code == 200 and r.json()["partial"] is True and r.json()["failed_shards"] == {"a": "unavailable"}
    r = client.post("/v1/search", json={"query": "(python"})
    assert (
        r.status_code == 400
        and r.json()["error"]["type"] == "query_syntax_error"
        and r.json()["error"]["position"] == 0
    )
    for body, says in [
        ({"query": "a", "top_k": 51}, "top_k is at most 50"),
        ({"query": "a", "extra": 1}, "extra"),
        ({"top_k": 3}, "query"),
        ({"query": "a" * 2049}, "query"),
    ]:
        r = client.post("/v1/search", json=body)
        assert r.status_code == 400, body
        assert r.json()["error"]["type"] == "invalid_request_error" and says in r.json()["error"]["message"], r.json()
    assert client.post("/v1/search", content=b"not json").status_code == 400
    assert client.get("/health").json() == {"status": "ok"}  # everything else: FastAPI


def test_a_refused_key_falls_through_to_the_401():
    client = _router('api_keys = ["k-12345678"]\n')
    assert client.post("/v1/search", json={"query": "a"}).status_code == 401
    ok = client.post("/v1/search", json={"query": "a"}, headers={"x-api-key": "k-12345678"})
    assert ok.status_code == 200


def test_the_shard_query_path_answers_json_and_refuses_bad_bodies():
    seen: list[str] = []
    app = QueryPath(FastAPI(), {"/v1/shard/echo": lambda d: {"got": d["x"]}}, seen.append)
    client = TestClient(app)
    assert client.post("/v1/shard/echo", json={"x": 1}).json() == {"got": 1}
    r = client.post("/v1/shard/echo", content=b"[1]")
    assert r.status_code == 400 and "JSON object" in r.json()["error"]["message"]
    assert client.post("/v1/shard/echo", json={}).status_code == 400  # KeyError → 400, never a 500
    assert seen == ["bad_request", "bad_request"]
    assert client.get("/v1/shard/echo").status_code in (404, 405)  # not a POST: FastAPI's


def test_the_shard_client_reports_an_unreachable_replica():
    from sluice.search.router.cluster.shard_query_client import ShardQueryClient, ShardQueryError

    async def go() -> None:
        http = ShardQueryClient()
        try:
            await http.post_json("http://127.0.0.1:9/v1/shard/search", {}, 1.0)
        except ShardQueryError as exc:
            assert "127.0.0.1:9" in str(exc)
        else:
            raise AssertionError("no error")
        await http.aclose()

    asyncio.run(go())


def _replica_app(
    arrived: asyncio.Event, release: asyncio.Event, transports: list[asyncio.Transport]
) -> web.Application:
    """An aiohttp stand-in for a replica's routes: /fast answers with its connection's port, /slow
    waits for `release`, /400 refuses, /list answers JSON that is not an object."""
    from aiohttp import web

    async def fast(request: web.Request) -> web.Response:
        transport = request.transport
        assert transport is not None  # None only once the connection is lost
        transports.append(transport)
        return web.json_response({"port": transport.get_extra_info("peername")[1], "got": (await request.json())["x"]})

    async def slow(request: web.Request) -> web.Response:
        arrived.set()
        await release.wait()  # set only when the test is over (its client is long gone)
        return web.json_response({})

    async def status(request: web.Request) -> web.Response:
        return web.json_response({"error": {"message": "bad"}}, status=400)

    async def not_json(request: web.Request) -> web.Response:
        return web.Response(text="[1, 2]")

    app = web.Application()
    app.add_routes(
        [web.post("/fast", fast), web.post("/slow", slow), web.post("/400", status), web.post("/list", not_json)]
    )
    return app


def test_the_shard_client_over_a_real_server_pools_times_out_and_never_reuses_a_cancelled_connection():
    """A small aiohttp server in this process on 127.0.0.1 (no sleeps: the slow route waits on an
    event set only at the end, so the timeout and the cancellation are deterministic)."""
    from aiohttp import web

    from sluice.search.router.cluster.shard_query_client import ShardQueryClient, ShardQueryError, ShardQueryTimeout

    async def go() -> None:
        arrived, release = asyncio.Event(), asyncio.Event()
        transports: list[asyncio.Transport] = []
        app = _replica_app(arrived, release, transports)
        runner = web.AppRunner(app, handle_signals=False)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        base = f"http://127.0.0.1:{runner.addresses[0][1]}"
        http = ShardQueryClient()
        try:
            s1, a = await http.post_json(base + "/fast", {"x": 1}, 5.0)
            s2, b = await http.post_json(base + "/fast", {"x": 2}, 5.0)
            assert (s1, s2, a["got"], b["got"]) == (200, 200, 1, 2)
            assert a["port"] == b["port"]  # keep-alive: the pooled connection served both
            assert await http.post_json(base + "/400", {}, 5.0) == (400, {"error": {"message": "bad"}})
            try:
                await http.post_json(base + "/list", {}, 5.0)
                raise AssertionError("a list accepted")
            except ShardQueryError as exc:
                assert "JSON object" in str(exc)

            # a lost hedge: cancelled while the replica is still working on it (on the pooled
            # connection); that connection must be closed, never handed to the next request
            hedge = asyncio.create_task(http.post_json(base + "/slow", {}, 30.0))
            await arrived.wait()
            hedge.cancel()
            await asyncio.gather(hedge, return_exceptions=True)
            assert hedge.cancelled()
            _, c = await http.post_json(base + "/fast", {"x": 3}, 5.0)
            assert c["port"] != a["port"] and c["got"] == 3

            # a timeout is ShardQueryTimeout (failover material), and that connection is dropped too
            try:
                await http.post_json(base + "/slow", {}, 0.2)
                raise AssertionError("no timeout")
            except ShardQueryTimeout as exc:
                assert "within 0.200s" in str(exc)
            _, d = await http.post_json(base + "/fast", {"x": 4}, 5.0)
            assert d["port"] != c["port"]

            # the replica closes an idle pooled connection: the next request still succeeds
            transports[-1].close()
            _, e = await http.post_json(base + "/fast", {"x": 5}, 5.0)
            assert e["got"] == 5
        finally:
            release.set()
            await http.aclose()
            await runner.cleanup()

    asyncio.run(go())


def test_the_shard_answers_its_query_requests_inside_uvicorns_protocol(tmp_path):
    """A real uvicorn server in this process on 127.0.0.1, with the shard's protocol
    (shard/query_protocol.py): query requests answered by it on one keep-alive connection,
    errors in the shard's shape, and every other route still through FastAPI."""
    import socket

    import uvicorn

    from sluice.search.router.cluster.shard_query_client import ShardQueryClient
    from sluice.search.shard.query_protocol import query_protocol_for
    from sluice.search.shard.replica import Replica
    from sluice.search.shard.server import create_shard_app

    replica = Replica(tmp_path, fsync=False)
    replica.append(1, [{"op": "upsert", "id": "d1", "fields": {"title": "alpha beta"}}], None)
    app = create_shard_app(replica)
    protocol = query_protocol_for(app)
    assert protocol is not None  # the installed uvicorn is the one it was written against
    answered: list[bytes] = []

    class Counting(protocol):
        def complete(self, query: Any) -> None:
            answered.append(self.url)
            super().complete(query)

    async def go() -> None:
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        sock.listen()  # listening already: a request sent before uvicorn accepts waits in the backlog
        server = uvicorn.Server(uvicorn.Config(app, log_level="warning", http=Counting, lifespan="off"))
        task = asyncio.create_task(server.serve(sockets=[sock]))
        base = f"http://127.0.0.1:{sock.getsockname()[1]}"
        http = ShardQueryClient()
        try:
            status, st = await http.post_json(base + "/v1/shard/stats", {"terms": ["alpha", "zzz"]}, 10)
            assert status == 200 and st["term_freqs"] == {"alpha": 1, "zzz": 0} and st["applied_seq"] == 1
            status, got = await http.post_json(base + "/v1/shard/search", {"tree": ["term", "alpha"], "top_k": 5}, 10)
            assert status == 200 and [h["id"] for h in got["hits"]] == ["d1"]
            status, bad = await http.post_json(base + "/v1/shard/search", {"tree": ["nope"]}, 10)
            assert status == 400 and "malformed" in bad["error"]["message"]
            # not a query request: FastAPI answers, in the shard's error shape
            status, bad = await http.post_json(base + "/v1/shard/compact", {"upto": -1}, 10)
            assert status == 400 and "upto" in bad["error"]["message"]
            assert answered == [b"/v1/shard/stats", b"/v1/shard/search", b"/v1/shard/search"]
        finally:
            await http.aclose()
            server.should_exit = True
            await task

    asyncio.run(go())
