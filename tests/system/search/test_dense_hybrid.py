"""Dense and hybrid retrieval through real processes: 3 shards in exact mode answer as one
index holding every document and vector (ids in order, equal scores), for dense, hybrid RRF
and hybrid weighted, filtered or not; vectors travel with the writes (embedded once by the
router). The reference is this process: the same embedding model, one ShardIndex, the same
fusion."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from sluice.search.dense.embedder import Embedder, attach_vectors
from sluice.search.index.hits import merge
from sluice.search.index.query_syntax import dense_text
from sluice.search.index.query_tree import resolve
from sluice.search.index.shard_index import ShardIndex
from sluice.search.retrieval import Fusion
from sluice.search.router.query.fusion import fuse
from tests import corpus
from tests.system.search.cluster import ingest, start_router

N_DOCS, N_QUERIES = 900, 60
CONFIG = """
[search]
shard_deadline_ms = 20000
vector_search = "exact"
[[shards]]
name = "a"
[[shards]]
name = "b"
[[shards]]
name = "c"
"""
FIELDS = ("title", "body")


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    docs = corpus.documents(N_DOCS)
    docs += [dict(docs[i], id=f"twin-{i}") for i in range(0, 60, 3)]  # equal texts: equal vectors, tied scores
    embedder = Embedder()
    ops = {0: [{"op": "upsert", "id": d["id"], "fields": {k: v for k, v in d.items() if k != "id"}} for d in docs]}
    attach_vectors(ops, embedder, FIELDS)
    one = ShardIndex(None)
    one.apply(1, ops[0])
    router = start_router(tmp_path_factory.mktemp("dense"), CONFIG)
    try:
        ingest(router.url, docs)
        yield router, one, embedder, corpus.queries(docs, N_QUERIES, seed=4)
    finally:
        router.stop()


def _ask(url, q, **body):
    r = httpx.post(url + "/v1/search", json={"query": q, "top_k": 10, "snippet_chars": 0, **body}, timeout=60)
    assert r.status_code == 200, r.text
    assert not r.json()["partial"]
    return r.json()["hits"]


def _same(got, want, q):
    assert [h["id"] for h in got] == [h.doc_id for h in want], q
    for g, w in zip(got, want):
        assert g["score"] == pytest.approx(w.score, rel=1e-9, abs=1e-12), q


def test_dense_across_three_shards_is_one_index(world):
    router, one, embedder, queries = world
    with ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(lambda q: _ask(router.url, q, mode="dense"), queries))
    ties = 0
    for q, got in zip(queries, answers):
        want = one.dense_search(embedder.query(dense_text(q)), 10)
        _same(got, want, q)
        ties += any(a.score == b.score for a, b in zip(want, want[1:]))
    flt = {"section": {"not_in": ["libs"]}}
    for q in queries[:20]:
        from sluice.search.index.filters import decode_filter

        want = one.dense_search(embedder.query(dense_text(q)), 10, clauses=decode_filter(flt, {}))
        _same(_ask(router.url, q, mode="dense", filter=flt), want, q)
    twins = _ask(router.url, corpus.documents(1)[0]["title"], mode="dense", top_k=3)
    assert twins and twins[0]["score"] > 0.5


@pytest.mark.parametrize("fusion,weight", [(Fusion.RRF, 0.5), (Fusion.RRF, 0.8), (Fusion.WEIGHTED, 0.5)])
def test_hybrid_across_three_shards_is_one_index(world, fusion, weight):
    router, one, embedder, queries = world
    hybrid = {"fusion": fusion.value, "dense_weight": weight, "window": 30}
    for q in queries:
        got = _ask(router.url, q, mode="hybrid", hybrid=hybrid)
        tree = resolve(q, one.analyzer)
        lexical = merge([one.search(tree, 30)], 30) if "*" not in q else None
        if lexical is None:
            continue  # the reference does not expand wildcards
        dense = one.dense_search(embedder.query(dense_text(q)), 30)
        _same(got, fuse(lexical, dense, 10, fusion, 60, weight), q)


def test_mode_errors_are_400s(world):
    router = world[0]
    for body, named in [
        ({"mode": "semantic"}, "mode: one of lexical, dense, hybrid"),
        ({"mode": "dense", "hybrid": {}}, 'hybrid: only with "mode": "hybrid"'),
        ({"mode": "hybrid", "hybrid": {"rrf_k": 0}}, "hybrid.rrf_k"),
        ({"mode": "hybrid", "hybrid": {"dense_weight": 2}}, "hybrid.dense_weight"),
        ({"mode": "hybrid", "top_k": 20, "hybrid": {"window": 10}}, "hybrid.window"),
        ({"mode": "hybrid", "hybrid": {"fusion": "max"}}, "hybrid.fusion"),
    ]:
        r = httpx.post(router.url + "/v1/search", json={"query": "package", **body}, timeout=30)
        assert r.status_code == 400 and named in r.json()["error"]["message"], (body, r.text)


def test_a_service_without_vectors_refuses_dense_modes(tmp_path):
    router = start_router(tmp_path, '[search]\nvectors = false\n[[shards]]\nname = "only"\n', "novec")
    try:
        ingest(router.url, corpus.documents(20))
        r = httpx.post(router.url + "/v1/search", json={"query": "package", "mode": "hybrid"}, timeout=30)
        assert r.status_code == 400 and "vectors = false" in r.json()["error"]["message"]
        assert httpx.post(router.url + "/v1/search", json={"query": "package"}, timeout=30).status_code == 200
    finally:
        router.stop()
