from __future__ import annotations

import json
import random

from sluice.search.index.hits import Hit, merge
from sluice.search.index.schema import parse_document
from sluice.search.router.bulk import plan_bulk
from sluice.search.router.config import parse_config
from sluice.search.router.replica_picker import pick_replica
from sluice.search.router.replica_state import ReplicaState
from sluice.search.router.result_cache import ResultCache
from sluice.search.router.topology import Topology


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
    content = _topo('[search]\nsharding = "content"\ncontent_field = "k"\n[[shards]]\nname = "a"\nvalues = ["x"]\n'
                    '[[shards]]\nname = "b"\ndefault = true\n')
    plan = plan_bulk(b'{"id": "1", "k": "x"}\n{"id": "2", "k": "y"}\n', content)
    assert plan.batches[0] == [{"op": "upsert", "id": "1", "fields": {"k": "x"}}, {"op": "delete", "id": "2"}]
    assert plan.batches[1] == [{"op": "delete", "id": "1"}, {"op": "upsert", "id": "2", "fields": {"k": "y"}}]
    assert content.shard_for(parse_document({"id": "3", "k": 5})) == 1


def test_result_cache_is_lru_and_counts_hits():
    c = ResultCache(2)
    c.put(("a", 10, (1,)), 1)
    c.put(("b", 10, (1,)), 2)
    assert c.get(("a", 10, (1,))) == 1
    c.put(("c", 10, (1,)), 3)  # evicts b, the least recently used
    assert c.get(("b", 10, (1,))) is None and c.get(("a", 10, (2,))) is None
    assert c.hits == 1 and c.lookups == 3


def test_a_query_only_router_refuses_writes():
    from fastapi.testclient import TestClient

    from sluice.search.router.app import create_router_app
    from sluice.search.router.runtime import RouterRuntime

    cfg = parse_config('[search]\naccept_writes = false\n[[shards]]\nname = "a"\nreplicas = ["127.0.0.1:9"]\n')
    client = TestClient(create_router_app(RouterRuntime(cfg, [["http://127.0.0.1:9"]])))
    r = client.post("/v1/search/documents", content=b'{"id": "1"}\n')
    assert r.status_code == 405 and r.json()["error"]["type"] == "query_only_router"
    assert client.delete("/v1/search/documents/1").status_code == 405
    assert client.post("/v1/search", json={"query": "(a"}).json()["error"]["position"] == 0
    page = client.get("/status")
    assert page.status_code == 200 and "/v1/search/status" in page.text
