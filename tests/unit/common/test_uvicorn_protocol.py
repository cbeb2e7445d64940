"""uvicorn's private httptools protocol, found in one place (common/uvicorn_protocol.py): with the
pinned uvicorn both servers use their subclasses; where the class is not the one they were
written against (it does not import, or lacks a method they override), both still serve, on
uvicorn's own protocol, through real uvicorn servers on 127.0.0.1."""

from __future__ import annotations

import asyncio
import logging
import socket
import sys
from collections.abc import Awaitable, Callable

import httpx
import pytest
import uvicorn
import uvicorn.protocols.http.auto
from uvicorn.protocols.http import httptools_impl

from sluice.api.connection_watch import ConnectionWatch, WatchedHttpToolsProtocol, watched_protocol
from sluice.api.server import build_server
from sluice.common.uvicorn_protocol import httptools_protocol
from sluice.search.shard.query_protocol import query_protocol_for, uvicorn_http_option
from sluice.search.shard.replica import Replica
from sluice.search.shard.server import create_shard_app
from tests.fuzz_app import unready_app

REAL = httptools_impl.HttpToolsProtocol


class _Lacking:
    """uvicorn's protocol as another version might have it: a hook the subclasses override is gone."""

    def connection_made(self, transport): ...
    def data_received(self, data): ...


def _differ(monkeypatch: pytest.MonkeyPatch, how: str) -> None:
    if how == "import-fails":
        monkeypatch.setitem(sys.modules, "uvicorn.protocols.http.httptools_impl", None)
    else:
        monkeypatch.setattr(httptools_impl, "HttpToolsProtocol", _Lacking)


def _serve(server: uvicorn.Server, talk: Callable[[str], Awaitable[None]]) -> None:
    async def go() -> None:
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        task = asyncio.create_task(server.serve(sockets=[sock]))
        for _ in range(6000):  # up to 60 s
            if server.started or task.done():
                break
            await asyncio.sleep(0.01)
        assert server.started, "the server did not start"
        try:
            await talk(f"http://127.0.0.1:{sock.getsockname()[1]}")
        finally:
            server.should_exit = True
            await asyncio.wait_for(task, 60)

    asyncio.run(go())


def test_the_pinned_uvicorn_is_the_one_both_subclasses_extend(tmp_path):
    assert httptools_protocol() is REAL
    assert issubclass(watched_protocol(ConnectionWatch(5.0)), REAL)
    protocol = query_protocol_for(create_shard_app(Replica(tmp_path, fsync=False)))
    assert protocol is not None and issubclass(protocol, REAL) and issubclass(WatchedHttpToolsProtocol, REAL)


@pytest.mark.parametrize("how", ["import-fails", "lacks-a-hook"])
def test_serving_falls_back_to_uvicorns_own_protocol(monkeypatch, caplog, how):
    app, rt = unready_app()
    _differ(monkeypatch, how)
    assert httptools_protocol() is None
    with caplog.at_level(logging.WARNING, logger="sluice.server"):
        server = build_server(app, rt)
    assert "serving with uvicorn's default protocol" in caplog.text
    assert server.config.http == "auto"

    async def talk(base: str) -> None:
        async with httpx.AsyncClient(base_url=base, timeout=60) as client:
            assert (await client.get("/health")).status_code == 200
            assert (await client.get("/v1/models")).json()["data"] == []  # the app, through the fallback

    _serve(server, talk)
    assert server.config.http_protocol_class is REAL  # uvicorn's own class served


@pytest.mark.parametrize("how", ["import-fails", "lacks-a-hook"])
def test_the_shard_falls_back_to_its_asgi_query_path(tmp_path, monkeypatch, caplog, how):
    replica = Replica(tmp_path, fsync=False)
    replica.append(1, [{"op": "upsert", "id": "d1", "fields": {"title": "alpha beta"}}], None)
    app = create_shard_app(replica)
    _differ(monkeypatch, how)
    with caplog.at_level(logging.WARNING, logger="sluice.server"):
        option = uvicorn_http_option(app)
    assert option == {} and "sluice search shard" in caplog.text
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off", **option))

    async def talk(base: str) -> None:
        async with httpx.AsyncClient(base_url=base, timeout=60) as client:
            r = await client.post("/v1/shard/search", json={"tree": ["term", "alpha"], "top_k": 5})
            assert r.status_code == 200 and [h["id"] for h in r.json()["hits"]] == ["d1"]
            bad = await client.post("/v1/shard/search", json={"tree": ["nope"]})
            assert bad.status_code == 400 and "malformed" in bad.json()["error"]["message"]

    _serve(server, talk)
    assert server.config.http_protocol_class is REAL


@pytest.mark.parametrize("how", ["import-fails", "lacks-a-hook"])
def test_the_search_router_falls_back_to_its_asgi_front(monkeypatch, caplog, how):
    from sluice.search.router.config import parse_config
    from sluice.search.router.http.app import create_router_app
    from sluice.search.router.http.front import RouterFront
    from sluice.search.router.http.search_protocol import search_protocol_for
    from sluice.search.router.http.search_protocol import uvicorn_http_option as router_http_option
    from sluice.search.router.runtime import RouterRuntime

    rt = RouterRuntime(parse_config('[[shards]]\nname = "a"\nreplicas = ["127.0.0.1:9"]\n'), [["http://127.0.0.1:9"]])
    protocol = search_protocol_for(rt)
    assert protocol is not None and issubclass(protocol, REAL)  # with the pinned uvicorn
    _differ(monkeypatch, how)
    with caplog.at_level(logging.WARNING, logger="sluice.server"):
        option = router_http_option(rt)
    assert option == {} and "sluice search router" in caplog.text
    server = uvicorn.Server(uvicorn.Config(RouterFront(create_router_app(rt), rt), log_level="warning", lifespan="off"))

    async def talk(base: str) -> None:
        async with httpx.AsyncClient(base_url=base, timeout=60) as client:
            r = await client.post("/v1/search", json={"query": "alpha"})  # no shard listens: partial
            assert r.status_code == 200 and r.json()["failed_shards"] == {"a": "unavailable"}
            bad = await client.post("/v1/search", json={"query": "(alpha"})
            assert bad.status_code == 400 and bad.json()["error"]["type"] == "query_syntax_error"

    _serve(server, talk)
    assert server.config.http_protocol_class is REAL
