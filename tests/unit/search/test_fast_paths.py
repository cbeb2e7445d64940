"""The query path's plain-ASGI layers: well-formed requests are answered there, everything else
falls through to FastAPI with the documented error shapes (no servers: nothing listens on the
shard address, so a search is answered partial)."""

from __future__ import annotations

import asyncio

from fastapi import FastAPI
from fastapi.testclient import TestClient

from sluice.search.router.config import parse_config
from sluice.search.shard.query_path import QueryPath


def _router(extra: str = "") -> TestClient:
    from sluice.search.router.app import create_router_app
    from sluice.search.router.fast_http.search_path import SearchFastPath
    from sluice.search.router.runtime import RouterRuntime

    cfg = parse_config(f'[search]\nmax_top_k = 50\n{extra}[[shards]]\nname = "a"\nreplicas = ["127.0.0.1:9"]\n')
    rt = RouterRuntime(cfg, [["http://127.0.0.1:9"]])
    return TestClient(SearchFastPath(create_router_app(rt), rt))


def test_a_well_formed_search_is_answered_and_errors_keep_their_shapes():
    client = _router()
    r = client.post("/v1/search", json={"query": "python", "top_k": 5})
    assert r.status_code == 200 and r.json()["partial"] is True and r.json()["failed_shards"] == {"a": "unavailable"}
    r = client.post("/v1/search", json={"query": "(python"})
    assert r.status_code == 400 and r.json()["error"]["type"] == "query_syntax_error" and r.json()["error"]["position"] == 0
    for body, says in [({"query": "a", "top_k": 51}, "top_k is at most 50"), ({"query": "a", "extra": 1}, "extra"),
                       ({"top_k": 3}, "query"), ({"query": "a" * 2049}, "query")]:
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
    from sluice.search.router.fast_http.client import ShardHttp, ShardHttpError

    async def go() -> None:
        http = ShardHttp()
        try:
            await http.post_json("http://127.0.0.1:9/v1/shard/search", {}, 1.0)
        except ShardHttpError as exc:
            assert "127.0.0.1:9" in str(exc)
        else:
            raise AssertionError("no error")
        await http.aclose()

    asyncio.run(go())
