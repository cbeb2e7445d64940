from __future__ import annotations

import asyncio
import gc
import json
import random

import httpx

from sluice.search.contract import SearchResponse
from sluice.search.index.hits import Hit, merge
from sluice.search.index.schema import parse_document
from sluice.search.router.cluster.replica_state import ReplicaState
from sluice.search.router.cluster.topology import Topology
from sluice.search.router.config import parse_config
from sluice.search.router.query.replica_picker import pick_replica
from sluice.search.router.query.result_cache import ResultCache
from sluice.search.router.replication.health_poller import HealthPoller
from sluice.search.router.search_metrics import SearchMetrics
from sluice.search.router.writes.bulk import plan_bulk


def _topo(text: str) -> Topology:
    cfg = parse_config(text)
    return Topology(cfg, [[f"http://r{i}"] for i in range(len(cfg.shards))], [[False]] * len(cfg.shards))


def test_power_of_two_choices_prefers_the_cheaper_and_skips_down_replicas():
    fast, slow, down = ReplicaState("f", "s/0"), ReplicaState("s", "s/1"), ReplicaState("d", "s/2")
    slow.in_flight, slow.ewma_s = 5, 0.05
    down.down_until = 100.0
    rng = random.Random(1)
    picks = [pick_replica([fast, slow, down], set(), rng, now=1.0).url for _ in range(200)]
    assert set(picks) == {"f"}  # the pair is always {fast, slow}: the down one is skipped
    assert pick_replica([fast, slow], {"f", "s"}, rng) is None
    assert pick_replica([down], set(), rng, now=1.0) is down  # all down: still ask one
    down.reachable = False  # ...unless the health poll found it not answering: never asked
    assert pick_replica([down], set(), rng, now=1.0) is None
    assert pick_replica([fast, down], set(), rng, now=1.0) is fast


def test_a_cancelled_hedge_raises_the_loser_ewma():
    r = ReplicaState("x", "s/0")
    r.observe_lower_bound(1.0)
    assert r.ewma_s > 0.1


def test_merge_breaks_ties_by_id_despite_last_bit_noise():
    a = [Hit("b", 1.0000000000000002, {}), Hit("d", 0.5, {})]
    b = [Hit("a", 1.0, {}), Hit("c", 0.7, {})]
    assert [h.doc_id for h in merge([a, b], 3)] == ["a", "b", "c"]


def test_bulk_plan_places_by_hash_and_content():
    topo = _topo('[[shards]]\nname = "a"\n[[shards]]\nname = "b"\n')
    body = "\n".join(json.dumps({"id": str(i), "title": "t"}) for i in range(50)).encode()
    plan = plan_bulk(body, topo)
    assert plan.accepted == 50 and not plan.errors
    assert sorted(op["id"] for ops in plan.batches.values() for op in ops) == sorted(str(i) for i in range(50))
    assert all(plan.batches.values())
    content = _topo(
        '[search]\nsharding = "content"\ncontent_field = "k"\n[[shards]]\nname = "a"\nvalues = ["x"]\n'
        '[[shards]]\nname = "b"\ndefault = true\n'
    )
    plan = plan_bulk(b'{"id": "1", "k": "x"}\n{"id": "2", "k": "y"}\n', content)
    assert plan.batches[0] == [{"op": "upsert", "id": "1", "fields": {"k": "x"}}, {"op": "delete", "id": "2"}]
    assert plan.batches[1] == [{"op": "delete", "id": "1"}, {"op": "upsert", "id": "2", "fields": {"k": "y"}}]
    assert content.shard_for(parse_document({"id": "3", "k": 5})) == 1


def _answer(*ids: str) -> SearchResponse:
    return SearchResponse([Hit(i, 1.5, {"t": "é " + i}, "<b>x</b>") for i in ids], 2, 2, {}, took_ms=3.0)


def test_result_cache_is_lru_and_counts_hits():
    c = ResultCache(2)
    c.put(("a", 10, (1,)), _answer("1"))
    c.put(("b", 10, (1,)), _answer("2"))
    assert [h.doc_id for h in c.get(("a", 10, (1,))).hits] == ["1"]
    c.put(("c", 10, (1,)), _answer("3"))  # evicts b, the least recently used
    assert c.get(("b", 10, (1,))) is None and c.get(("a", 10, (2,))) is None
    assert c.hits == 1 and c.lookups == 3


def test_a_cached_answer_is_the_answer_and_costs_the_collector_nothing_once_seen():
    """An entry is plain tuples: after one collection the collector no longer tracks any of it
    (a kept Hit or list would be walked by every collection until evicted)."""
    c = ResultCache(10)
    answer = _answer("x", "y")
    local = SearchResponse([Hit("z", 2.0, '{"t":"z"}')], 1, 1, {})  # a local read's hit: its fields as JSON text
    c.put(("q",), answer)
    c.put(("l",), local)
    got = c.get(("q",))
    assert got is not None and got.cached and got.to_json() == {**answer.to_json(), "cached": True, "took_ms": 0.0}
    assert json.loads(c.get(("l",)).json_bytes())["hits"] == local.to_json()["hits"]
    gc.collect()
    assert not any(gc.is_tracked(entry) for entry in c._d.values())


def test_a_query_only_router_refuses_writes():
    from fastapi.testclient import TestClient

    from sluice.search.router.http.app import create_router_app
    from sluice.search.router.runtime import RouterRuntime

    cfg = parse_config('[search]\naccept_writes = false\n[[shards]]\nname = "a"\nreplicas = ["127.0.0.1:9"]\n')
    client = TestClient(create_router_app(RouterRuntime(cfg, [["http://127.0.0.1:9"]])))
    r = client.post("/v1/search/documents", content=b'{"id": "1"}\n')
    assert r.status_code == 405 and r.json()["error"]["type"] == "query_only_router"
    assert client.delete("/v1/search/documents/1").status_code == 405
    assert client.post("/v1/search", json={"query": "(a"}).json()["error"]["position"] == 0
    page = client.get("/status")
    assert page.status_code == 200 and "/v1/search/status" in page.text


def test_a_bulk_of_exactly_the_maximum_lines_newline_terminated_is_accepted():
    from sluice.search.errors import DocumentError
    from sluice.search.router.writes.bulk import MAX_LINES

    topo = _topo('[[shards]]\nname = "a"\n')
    body = "".join(f'{{"id": "{i}"}}\n' for i in range(MAX_LINES)).encode()
    plan = plan_bulk(body, topo)  # the final newline ends the last line; it starts no other
    assert plan.accepted == MAX_LINES and not plan.errors
    try:
        plan_bulk(body + b'{"id": "one more"}\n', topo)
        raise AssertionError("more than the maximum accepted")
    except DocumentError as exc:
        assert f"at most {MAX_LINES} lines" in str(exc)


def test_bulk_lines_json_accepts_but_the_write_path_cannot_are_reported_by_number():
    topo = _topo('[[shards]]\nname = "a"\n[[shards]]\nname = "b"\n')
    bad = [
        '{"id": "n", "x": NaN}',
        '{"id": "i", "x": -Infinity}',
        '{"id": "o", "x": 1e999}',
        '{"id": "d", "x": ' + "9" * 5000 + "}",
        '{"id": "\\ud800", "x": "y"}',
        '{"id": "s", "x": "\\udc00"}',
        '{"id": "k", "\\ud800": "y"}',
        '{"id": "deep", "x": ' + "[" * 10_000 + "]" * 10_000 + "}",
    ]
    good = [json.dumps({"id": str(i), "title": "fine"}) for i in range(4)]
    plan = plan_bulk("\n".join(good[:2] + bad + good[2:]).encode(), topo)
    assert [e["line"] for e in plan.errors] == list(range(3, 3 + len(bad)))
    assert plan.accepted == 4
    assert sorted(op["id"] for ops in plan.batches.values() for op in ops) == ["0", "1", "2", "3"]


def test_reported_scores_are_the_order_and_ties_go_by_id():
    """Equal scores that differ in their last bits (computed on different shards) are reported
    as one number and ordered by id; a client re-sorting by (score desc, id) gets the same list."""
    a = [Hit("b", 5.334786137463693, {}), Hit("d", 1.25, {})]
    b = [Hit("a", 5.334786137463695, {}), Hit("c", 5.334786137463690, {}), Hit("e", 7.0, {})]
    merged = merge([a, b], 5)
    assert [h.doc_id for h in merged] == ["e", "a", "b", "c", "d"]
    assert [h.score for h in merged] == [7.0, 5.33478613746, 5.33478613746, 5.33478613746, 1.25]
    assert merged == sorted(merged, key=lambda h: (-h.score, h.doc_id))


def test_merge_equals_the_full_sort_by_reported_score_at_the_cut():
    """merge rounds only the top_k and the ties at the cut (hits.py _top): its answer must be
    the full sort's, with the ties around the k-th place (scores that differ in their last bits,
    in the 13th digit, or not at all) where a shortcut would most likely go wrong."""
    from sluice.search.index.hits import merge_rescored, rank_key

    rng = random.Random(7)
    base = [5.334786137463693, 1.0, 0.9999999999995, 12.5]
    for _ in range(2000):
        shards = []
        for s in range(rng.randint(1, 3)):
            hits = []
            for i in range(rng.randint(0, 12)):
                b = rng.choice(base)
                score = rng.choice([b, b * (1 + rng.choice([1, -1]) * 10.0 ** -rng.randint(11, 16)), rng.random() * 10])
                hits.append(Hit(f"{rng.randint(0, 40):02d}-{s}-{i}", score, {}))
            shards.append(hits)
        k = rng.randint(0, 12)
        want = sorted((h for hits in shards for h in hits), key=rank_key)[:k]
        got = merge(shards, k)
        assert [h.doc_id for h in got] == [h.doc_id for h in want]
        assert [h.score for h in got] == [-rank_key(h)[0] for h in want]
        assert [h.doc_id for h in merge_rescored([(h.score, h) for hits in shards for h in hits], k)] == [
            h.doc_id for h in want
        ]


def test_a_write_that_fails_on_one_shard_says_which_parts_were_written():
    """One shard's write raising anything (not only 'no replica') must not turn the batch into a
    500 after the other shard's part was written: the answer names both."""
    import asyncio

    from sluice.search.router.runtime import RouterRuntime

    cfg = parse_config(
        '[[shards]]\nname = "a"\nreplicas = ["127.0.0.1:9"]\n[[shards]]\nname = "b"\nreplicas = ["127.0.0.1:9"]\n'
    )
    rt = RouterRuntime(cfg, [["http://127.0.0.1:9"], ["http://127.0.0.1:10"]])

    async def write_shard(shard, ops):  # a deterministic fault: shard b fails in an unforeseen way
        if shard.name == "b":
            raise RuntimeError("boom")
        return 7

    rt.writer.write_shard = write_shard
    out = asyncio.run(rt.writer.write({0: [{"op": "delete", "id": "x"}], 1: [{"op": "delete", "id": "y"}]}))
    assert out.written == {"a": 7} and "RuntimeError" in out.failed["b"] and "boom" not in out.failed["b"]


def test_after_a_500_the_connection_is_closed_and_says_so():
    """A real uvicorn server in this process: a route that fails unexpectedly answers 500 in the
    API's error shape with `connection: close`, and the next request on a new connection works
    (a client reusing the old one would meet a reset)."""
    import http.client
    import socket
    import threading

    import uvicorn

    from sluice.search.router.http.app import create_router_app
    from sluice.search.router.http.front import RouterFront
    from sluice.search.router.runtime import RouterRuntime

    cfg = parse_config('[[shards]]\nname = "a"\nreplicas = ["127.0.0.1:9"]\n')
    rt = RouterRuntime(cfg, [["http://127.0.0.1:9"]])

    def failing_status():  # a deterministic fault in a FastAPI route
        raise RuntimeError("injected")

    async def failing_search(request):  # and in the front's own path
        raise RuntimeError("injected")

    rt.status, rt.search = failing_status, failing_search
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(
        uvicorn.Config(RouterFront(create_router_app(rt), rt), log_level="critical", lifespan="off")
    )
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        for _ in range(600):
            if server.started:
                break
            threading.Event().wait(0.1)
        conn = http.client.HTTPConnection("127.0.0.1", sock.getsockname()[1], timeout=60)
        for method, path, body in [("GET", "/v1/search/status", None), ("POST", "/v1/search", b'{"query": "a"}')]:
            conn.request(method, path, body=body, headers={"content-type": "application/json"})
            r = conn.getresponse()
            payload = json.loads(r.read())
            assert r.status == 500 and r.getheader("connection") == "close", (path, r.getheaders())
            assert payload == {"error": {"type": "api_error", "message": payload["error"]["message"]}}
            assert "injected" not in payload["error"]["message"]
            conn.close()
        conn.request("GET", "/health")
        assert conn.getresponse().status == 200
    finally:
        server.should_exit = True
        thread.join(30)


def test_next_poll_returns_once_a_later_poll_round_ends():
    """The router's readiness waits on this (router/main.py): no sleep loop, woken by the poll
    that can change the answer. Deterministic: the rounds are run by hand, nothing listens."""

    async def go() -> None:
        cfg = parse_config('[[shards]]\nname = "a"\nreplicas = ["127.0.0.1:9"]\n')
        topo = Topology(cfg, [["http://127.0.0.1:9"]], [[False]])
        async with httpx.AsyncClient() as http:
            poller = HealthPoller(topo, http, SearchMetrics())
            await poller.poll_once()  # a round before the wait began does not count
            waiter = asyncio.create_task(poller.next_poll())
            await asyncio.sleep(0)  # the waiter is waiting now
            assert not waiter.done()
            await poller.poll_once()
            await asyncio.wait_for(waiter, 60)
            assert poller.polls == 2 and not topo.shards[0].replicas[0].reachable

    asyncio.run(go())
