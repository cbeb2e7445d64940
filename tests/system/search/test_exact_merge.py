"""Through real processes: the top-10 of 3 shards equals one index holding the same documents
(ids in order, scores within 1e-9 relative) on 200 queries, for hash and content sharding.

The reference is the index library alone, in this process: one Xapian database with every
document, searched with its own statistics."""

from __future__ import annotations

from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import pytest

from sluice.search.contract import DEFAULT_SNIPPET_CHARS
from sluice.search.index.hits import merge
from sluice.search.index.query_tree import resolve
from sluice.search.index.schema import parse_document
from sluice.search.index.shard_index import ShardIndex
from sluice.search.router.cluster.topology import hash_shard
from tests import corpus
from tests.system.search.cluster import ingest, search, start_router, status

N_DOCS, N_QUERIES = 1500, 200
# generous: a busy test machine must not turn a slow shard into a partial answer
SETTINGS = "shard_deadline_ms = 20000\n"

HASH = f"""
[search]
sharding = "hash"
{SETTINGS}
[[shards]]
name = "a"
[[shards]]
name = "b"
[[shards]]
name = "c"
"""


def _content(docs):  # skewed: the most common section alone on one shard
    top = [s for s, _ in Counter(d["section"] for d in docs).most_common(3)]
    return f"""
[search]
sharding = "content"
content_field = "section"
{SETTINGS}
[[shards]]
name = "big"
values = ["{top[0]}"]
[[shards]]
name = "mid"
values = ["{top[1]}", "{top[2]}"]
[[shards]]
name = "rest"
default = true
"""


@pytest.fixture(scope="module")
def docs():
    return corpus.documents(N_DOCS)


@pytest.fixture(scope="module")
def reference(docs):
    one = ShardIndex(None)
    for seq, d in enumerate(docs, 1):
        src = parse_document(d)
        one.apply(seq, [{"op": "upsert", "id": src.doc_id, "fields": src.fields}])
    return one


@pytest.mark.parametrize("kind", ["hash", "content"])
def test_three_shards_rank_and_score_like_one_index(kind, docs, reference, tmp_path):
    router = start_router(tmp_path, HASH if kind == "hash" else _content(docs), kind)
    try:
        ingest(router.url, docs)
        assert all(s["head_seq"] > 0 for s in status(router.url)["shards"])  # every shard got documents
        queries = corpus.queries(docs, N_QUERIES)
        with ThreadPoolExecutor(4) as pool:
            answers = list(pool.map(lambda q: search(router.url, q).json(), queries))
        with_hits = marked = total = 0
        for q, got in zip(queries, answers):
            want = merge(
                [reference.search(resolve(q, reference.analyzer), 10, snippet_chars=DEFAULT_SNIPPET_CHARS)], 10
            )
            assert not got["partial"] and got["shards_answered"] == 3, got
            assert [h["id"] for h in got["hits"]] == [h.doc_id for h in want], q
            _in_reported_order(got["hits"], q)
            for g, w in zip(got["hits"], want):
                assert g["score"] == pytest.approx(w.score, rel=1e-9, abs=0), q
                assert g["snippet"] == w.snippet, q  # the same passage as one index picks
                marked += "<b>" in g["snippet"]
                total += 1
            with_hits += bool(want)
        assert with_hits >= 150
        assert marked >= 0.8 * total, (marked, total)  # snippets show where the query matched
        # most queries met new terms once the shards' counts were known: one round trip
        # (router/query/global_stats/one_round.py) answered many of them, the checks above covering both paths
        one_round = status(router.url)["cache"]["one_round"]
        assert one_round["answered"] >= 50 and one_round["second_round"] >= 1, one_round
        if kind == "hash":
            _one_word_answers_come_in_the_order_of_their_reported_scores(router.url, docs)
            _writes_to_one_shard_refresh_its_statistics(router.url, docs, queries)
    finally:
        router.stop()


def _in_reported_order(hits, q):
    """Ordered by exactly the reported score (highest first), ties by id: a client re-sorting
    the hits gets the same list."""
    keys = [(-h["score"], h["id"]) for h in hits]
    assert keys == sorted(keys), (q, keys)


def _one_word_answers_come_in_the_order_of_their_reported_scores(url, docs):
    """One-word queries over many documents tie often (equal lengths and counts), and shards
    compute equal scores that differ in their last bits: issue 40 found 39 of 100 such answers
    out of their reported order."""
    words = sorted({w for q in corpus.queries(docs, 400, seed=5) for w in q.split() if w.isalpha()})[:100]
    ties = 0
    for w in words:
        hits = search(url, w, top_k=50).json()["hits"]
        _in_reported_order(hits, w)
        ties += any(a["score"] == b["score"] for a, b in zip(hits, hits[1:]))
    assert ties >= 10  # the check met ties


def _writes_to_one_shard_refresh_its_statistics(url, docs, queries):
    """The router now knows most query terms' statistics at every shard's entry (phase 1 is
    skipped for them). Copies of documents written to shard "a" alone change its counts and
    the frequencies of their terms: the next answers must be scored with the new statistics
    (those of one index holding every document, copies included), not the cached ones."""
    before = status(url)
    assert before["cache"]["stats_hits"] > 0
    copies = [{**d, "id": f"copy-{i}"} for i, d in enumerate(docs[::5]) if hash_shard(f"copy-{i}", 3) == 0]
    ingest(url, copies)
    after = status(url)
    heads = [(s["head_seq"], t["head_seq"]) for s, t in zip(before["shards"], after["shards"])]
    assert heads[0][1] > heads[0][0] and all(a == b for a, b in heads[1:]), heads  # only shard a moved
    one = ShardIndex(None)
    for seq, d in enumerate(docs + copies, 1):
        src = parse_document(d)
        one.apply(seq, [{"op": "upsert", "id": src.doc_id, "fields": src.fields}])
    changed = 0
    for q in queries[:100]:
        got = search(url, q).json()
        want = merge([one.search(resolve(q, one.analyzer), 10)], 10)
        assert [h["id"] for h in got["hits"]] == [h.doc_id for h in want], q
        for g, w in zip(got["hits"], want):
            assert g["score"] == pytest.approx(w.score, rel=1e-9, abs=0), q
        changed += any(h["id"].startswith("copy-") for h in got["hits"])
    assert changed >= 10  # the copies matter to these queries
