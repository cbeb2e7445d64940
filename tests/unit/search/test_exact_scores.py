"""Global statistics make N shards score exactly like one index (the library level; the system
test tests/system/search/test_exact_merge.py checks the same through real shard processes)."""

from __future__ import annotations

import zlib

import pytest

from sluice.search.index.bm25 import CollectionStats
from sluice.search.index.hits import merge
from sluice.search.index.query_tree import resolve, terms_of
from sluice.search.index.schema import parse_document
from sluice.search.index.shard_index import ShardIndex
from tests import corpus

N_DOCS, N_QUERIES = 3000, 200


@pytest.fixture(scope="module")
def docs():
    return corpus.documents(N_DOCS)


def _hash(doc, n):
    return zlib.crc32(doc["id"].encode()) % n


def _content(doc, n):  # skewed: one section family on shard 0, the rest spread
    return 0 if doc.get("section", "").startswith(("lib", "alpha")) else 1 + zlib.crc32(doc["id"].encode()) % (n - 1)


def _index(docs, n, place):
    shards = [ShardIndex(None) for _ in range(n)]
    for seq, d in enumerate(docs, 1):
        src = parse_document(d)
        shards[place(d, n)].apply(seq, [{"op": "upsert", "id": src.doc_id, "fields": src.fields}])
    return shards


def _distributed(shards, tree, k):
    glob = CollectionStats()
    for s in shards:
        glob.add(s.stats(terms_of(tree)))
    return merge([s.search(tree, k, glob) for s in shards], k)


@pytest.mark.parametrize("place", [_hash, _content], ids=["hash", "content"])
def test_top10_of_shards_equals_one_index(docs, place):
    one = _index(docs, 1, lambda d, n: 0)[0]
    shards = _index(docs, 3, place)
    sizes = [s.doc_count() for s in shards]
    assert sum(sizes) == one.doc_count() and min(sizes) > 0
    compared = 0
    for q in corpus.queries(docs, N_QUERIES):
        tree = resolve(q, one.analyzer)
        want = merge([one.search(tree, 10)], 10)
        got = _distributed(shards, tree, 10)
        assert [h.doc_id for h in got] == [h.doc_id for h in want], q
        for g, w in zip(got, want):
            assert g.score == pytest.approx(w.score, rel=1e-9, abs=0), q
        compared += bool(want)
    assert compared >= 150  # most queries have hits


def test_per_shard_statistics_differ_on_a_skewed_split(docs):
    """Without global statistics, content-skewed shards rank differently (why phase 1 exists)."""
    one = _index(docs, 1, lambda d, n: 0)[0]
    shards = _index(docs, 3, _content)
    differs = 0
    for q in corpus.queries(docs, 60):
        tree = resolve(q, one.analyzer)
        want = [h.doc_id for h in one.search(tree, 10)]
        got = [h.doc_id for h in merge([s.search(tree, 10) for s in shards], 10)]
        differs += got != want
    assert differs > 0
