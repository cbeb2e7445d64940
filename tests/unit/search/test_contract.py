"""The search service's typed messages (search/contract.py): what each side writes the other
decodes to the same message, bounds are the contract's, every refusal is a SearchError of the
right kind; the router, a replica and a cold shard are the services service.py lists."""

from __future__ import annotations

import json

import pytest

from sluice.search.contract import (
    DEFAULT_TOP_K,
    MAX_TOP_K,
    SearchRequest,
    ShardSearchAnswer,
    ShardSearchRequest,
    StatsAnswer,
    StatsRequest,
)
from sluice.search.errors import STATUS, QuerySyntaxError, SearchError, SearchErrorKind
from sluice.search.index.analyzer import Analyzer
from sluice.search.index.bm25 import CollectionStats
from sluice.search.index.hits import Hit
from sluice.search.index.query_tree import NodeKind, resolve


def _wire(message) -> dict:
    return json.loads(json.dumps(message.to_json()))  # what actually crosses


def test_messages_round_trip_through_their_json():
    tree = resolve("+python -java packag* title:tool", Analyzer())
    stats = CollectionStats(10, 200, {"python": 3})
    assert ShardSearchRequest.decode(
        _wire(ShardSearchRequest(["or", [["term", "a"], ["term", "b"]]], 5, stats, ["b"]))
    ) == ShardSearchRequest(["or", [["term", "a"], ["term", "b"]]], 5, stats, ["b"])
    assert StatsRequest.decode(_wire(StatsRequest(["a"], ["pa"]))) == StatsRequest(["a"], ["pa"])
    answer = StatsAnswer(stats, 7, {"pa": {"pack": 2, "packag": 1}})
    assert StatsAnswer.decode(_wire(answer)) == answer
    hits = ShardSearchAnswer([Hit("d1", 1.5, {"title": "x"})], 7, 0.001, {"b": 1}, [{"b": 0.5}])
    assert ShardSearchAnswer.decode(_wire(hits)) == hits
    assert tree[0] is NodeKind.AND_NOT and json.loads(json.dumps(tree))[0] == "and_not"  # kinds are their values


@pytest.mark.parametrize(
    "body,says",
    [
        (b'{"query": "a", "top_k": -1}', "at least 0"),
        (b'{"query": "a", "top_k": 51}', "at most 50"),
        (b'{"query": "a", "top_k": true}', "integer"),
        (b'{"top_k": 3}', "query"),
        (b"[]", "JSON object"),
    ],
)
def test_a_search_request_is_refused_by_the_contract_alone(body, says):
    with pytest.raises(SearchError) as exc:
        SearchRequest.decode(body, max_top_k=50)
    assert exc.value.kind is SearchErrorKind.INVALID_REQUEST and says in exc.value.message
    assert STATUS[exc.value.kind] == exc.value.status == 400
    assert SearchRequest.decode(b'{"query": "a"}', 50) == SearchRequest("a", DEFAULT_TOP_K)


def test_shard_requests_are_bounded_and_checked_once():
    with pytest.raises(SearchError, match=f"at most {MAX_TOP_K}"):
        ShardSearchRequest.decode({"tree": ["term", "a"], "top_k": MAX_TOP_K + 1})
    with pytest.raises(QuerySyntaxError):
        ShardSearchRequest.decode({"tree": ["wildcard", "a"], "top_k": 1})  # shards get expanded trees only
    with pytest.raises(SearchError, match="unknown needs"):
        ShardSearchRequest.decode({"tree": ["phrase", ["a", "b"]], "unknown": ["a"], "stats": None})
    with pytest.raises(SearchError, match="prefixes"):
        StatsRequest.decode({"terms": [], "prefixes": [""]})
    pruned = ShardSearchRequest(["term", "a"], 3, pruned=True)  # search.toml ranking = "pruned"
    assert _wire(pruned)["pruned"] is True and ShardSearchRequest.decode(_wire(pruned)) == pruned
    assert "pruned" not in _wire(ShardSearchRequest(["term", "a"], 3))  # exact: the default, not sent
    with pytest.raises(SearchError, match="pruned: true or false"):
        ShardSearchRequest.decode({"tree": ["term", "a"], "pruned": "yes"})
    with pytest.raises(ValueError):
        ShardSearchAnswer.decode({"hits": [{"id": "a", "score": 1.0}], "term_freqs": {"x": 1}, "parts": []})


def test_the_router_replicas_and_cold_shards_are_the_services_listed(tmp_path):
    from sluice.search.index.shard_index import ShardIndex
    from sluice.search.router.config import parse_config
    from sluice.search.router.runtime import RouterRuntime
    from sluice.search.service import SearchService, ShardService
    from sluice.search.shard.replica import Replica
    from sluice.search.tiers.cold_tier import ColdShard

    cfg = parse_config('[[shards]]\nname = "a"\nreplicas = ["127.0.0.1:9"]\n')
    assert isinstance(RouterRuntime(cfg, [["http://127.0.0.1:9"]]), SearchService)
    replica = Replica(tmp_path / "r", fsync=False)
    replica.append(1, [{"op": "upsert", "id": "d1", "fields": {"title": "alpha"}}])
    cold = ColdShard(ShardIndex(None), tmp_path, 0)
    for shard in (replica, cold):
        assert isinstance(shard, ShardService)
    assert replica.stats(StatsRequest(["alpha"])).stats.term_freqs == {"alpha": 1}
    assert [h.doc_id for h in replica.search(ShardSearchRequest(["term", "alpha"], 3)).hits] == ["d1"]
    assert cold.search(ShardSearchRequest(["term", "alpha"], 3)).hits == []
