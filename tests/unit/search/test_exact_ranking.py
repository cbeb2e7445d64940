"""Rankings equal a brute-force BM25 where Xapian's pruned matcher does not
(index/ranking.py), and the router's local shards are searched as one database
(tiers/local_reads.py LocalReads.union_top) with the same answers as one index.

The case: the postings of one 4-term query over 3,000 Debian package descriptions
(tests/data/xapian_pruning_case.json, numbers only), on which Xapian 1.4's matcher, left to
prune, drops document 2944 from the top 10 — a document that outscores the 8th hit."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import xapian

from sluice.search.contract import ShardSearchRequest
from sluice.search.index.analyzer import ID_SLOT
from sluice.search.index.bm25 import Bm25Params, CollectionStats, leaf_part, leaf_weight, local_weighting
from sluice.search.index.hits import merge, reported_score
from sluice.search.index.query_tree import NodeKind
from sluice.search.index.schema import parse_document
from sluice.search.index.shard_index import APPLIED_KEY, ShardIndex
from sluice.search.shard.replica import Replica
from sluice.search.tiers.local_reads import LocalReads
from tests import corpus
from tests.local_search_router import answers, local_router
from tests.paths import DATA

CASE = json.loads((DATA / "xapian_pruning_case.json").read_text())
TREE = [NodeKind.OR, [[NodeKind.TERM, t] for t in CASE["terms"]]]
MISSED = "d2944"  # what the pruned matcher leaves out of the top 10


def _id(i: int) -> str:
    return f"d{i + 1:04d}"


def _document(i: int, row: list[int]) -> xapian.Document:
    """A document with the case's postings: each term at its wdf, the rest of its length one
    filler term (a length counts every term's wdf)."""
    length, *wdfs = row
    doc = xapian.Document()
    for term, wdf in zip(CASE["terms"], wdfs):
        if wdf:
            doc.add_term(term, wdf)
    if length > sum(wdfs):
        doc.add_term("zfill", length - sum(wdfs))
    doc.add_value(ID_SLOT, _id(i))
    doc.set_data(json.dumps({"id": _id(i), "fields": {}}))
    return doc


def _brute_force(k: int) -> list[tuple[str, float]]:
    """The top k by Xapian's BM25 formula (index/bm25.py, the parameters sluice searches with)
    over every document, each scored whole: no matcher involved."""
    rows = CASE["docs"]
    n = len(rows)
    len_factor = n / sum(r[0] for r in rows)
    tf = [sum(1 for r in rows if r[1 + j]) for j in range(len(CASE["terms"]))]
    w = local_weighting(Bm25Params())
    scored = []
    for i, (length, *wdfs) in enumerate(rows):
        parts = [
            leaf_part(w, leaf_weight(w, n, tf[j], term), wdf, length, len_factor)
            for j, (term, wdf) in enumerate(zip(CASE["terms"], wdfs))
            if wdf
        ]
        if parts:
            scored.append((-reported_score(sum(parts)), _id(i)))
    scored.sort()
    return [(doc_id, -neg) for neg, doc_id in scored[:k]]


def _same(hits: Any, want: list[tuple[str, float]]) -> None:
    assert [h.doc_id for h in hits] == [d for d, _ in want]
    assert [h.score for h in hits] == pytest.approx([s for _, s in want], rel=1e-9)


@pytest.fixture(scope="module")
def one_index() -> ShardIndex:
    db = xapian.WritableDatabase("", xapian.DB_BACKEND_INMEMORY)
    for i, row in enumerate(CASE["docs"]):
        db.add_document(_document(i, row))
    return ShardIndex.read_only(db, vectors=False)


@pytest.fixture(scope="module")
def shard_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[int, Path]:
    """The case's documents in two on-disk shards (alternate documents), as a replica leaves
    them: entry 1 applied."""
    root = tmp_path_factory.mktemp("shards")
    dirs = {p: root / f"s{p}" for p in (0, 1)}
    for p, d in dirs.items():
        db = xapian.WritableDatabase(str(d), xapian.DB_CREATE_OR_OPEN)
        for i, row in enumerate(CASE["docs"]):
            if i % 2 == p:
                db.add_document(_document(i, row))
        db.set_metadata(APPLIED_KEY, "1")
        db.commit()
        db.close()
    return dirs


def test_one_index_ranks_what_brute_force_ranks(one_index: ShardIndex):
    want = _brute_force(10)
    assert MISSED in [d for d, _ in want]
    for k in (10, 9, 8):
        _same(merge([one_index.search(TREE, k)], k), _brute_force(k))


def test_the_local_shards_as_one_database_and_each_with_global_statistics_rank_what_brute_force_ranks(shard_dirs):
    reads = LocalReads(shard_dirs, None)
    asked = [(0, 1), (1, 1)]
    try:
        for k in (10, 8):
            got = reads.union_top(asked, ShardSearchRequest(TREE, k))
            assert got is not None
            _same(got[0], _brute_force(k))
            glob = CollectionStats()
            for p in (0, 1):
                glob.add(reads.readers[p].index(1).stats(CASE["terms"]))
            top = reads.top(asked, ShardSearchRequest(TREE, k, glob))  # query then fetch, each shard exact
            assert top is not None
            _same(top[0], _brute_force(k))
        assert reads.fell_back == 0
    finally:
        reads.close()


def _hits(rt: Any, queries: list[str], **ask: Any) -> list[list[dict]]:
    return [a["hits"] for a in answers(rt, queries, **ask)]


@pytest.fixture(scope="module")
def docs() -> list[dict]:
    return corpus.documents(600)


@pytest.fixture(scope="module")
def queries(docs: list[dict]) -> list[str]:
    return [d["title"] for d in docs[:80] if d.get("title")] + corpus.queries(docs, 80)


def test_a_search_over_local_shards_is_one_search_of_their_union_and_answers_as_one_index(
    docs, queries, tmp_path, monkeypatch
):
    one = local_router(docs, tmp_path / "one", shards=1)
    two = local_router(docs, tmp_path / "two", shards=2)
    try:
        want = _hits(one, queries, top_k=10, snippet_chars=80)
        want_filtered = _hits(one, queries[:20], top_k=5, filter={"section": {"not_in": ["libs"]}})

        def not_asked(*a: Any, **k: Any) -> Any:
            raise AssertionError("a statistics round or a shard's own ranking")

        monkeypatch.setattr(LocalReads, "stats", not_asked)
        monkeypatch.setattr(ShardIndex, "ranked", not_asked)
        plain = [q for q in queries if "*" not in q]  # a wildcard is expanded by a statistics round first
        assert len(plain) == len(queries)
        assert _hits(two, queries, top_k=10, snippet_chars=80) == want
        assert _hits(two, queries[:20], top_k=5, filter={"section": {"not_in": ["libs"]}}) == want_filtered
        assert two.local_reads.fell_back == 0
        assert all(len(s.latency) > 0 for s in two.topo.shards)  # each shard's time kept (its share)
    finally:
        one.local_reads.close()
        two.local_reads.close()


def test_the_union_follows_writes_and_a_revision_moved_under_it(docs, queries, tmp_path, monkeypatch):
    rt = local_router(docs, tmp_path, shards=2)
    reads = rt.local_reads
    try:
        before = _hits(rt, ["zebracorn"])[0]
        assert before == []
        new = parse_document({"id": "new-doc", "title": "zebracorn", "body": "a zebracorn grazes"})
        shard = rt.topo.shards[rt.topo.shard_for(new)]
        Replica(tmp_path / shard.name, fsync=False).append(2, [{"op": "upsert", "id": "new-doc", "fields": new.fields}])
        shard.head_seq = 2
        assert [h["id"] for h in _hits(rt, ["zebracorn grazes"])[0]] == ["new-doc"]

        real_search, failures = ShardIndex.search, [1]

        def moving(self: ShardIndex, *a: Any, **k: Any) -> Any:
            if failures[0] > 0:
                failures[0] -= 1
                raise xapian.DatabaseModifiedError("the writer reused the blocks")
            return real_search(self, *a, **k)

        monkeypatch.setattr(ShardIndex, "search", moving)
        want = _hits(rt, queries[:1], top_k=7)[0]
        assert want and reads.fell_back == 0  # read again: answered
        failures[0] = 2  # moved twice: the statistics round and each shard's ranking answer
        again = _hits(rt, queries[:1], top_k=6)[0]  # another top_k: not the result cache's answer
        assert reads.fell_back == 1 and again == want[:6]
    finally:
        reads.close()


def test_ranking_pruned_asks_xapian_to_prune_and_exact_to_score_every_match(one_index, docs, tmp_path, monkeypatch):
    """`ranking = "pruned"` (search.toml) reaches every ranking: the shard's Enquire is asked for
    its top_k alone, and the router's local shards are not searched as one (Xapian prunes a union
    of databases worse than one index)."""
    asked: list[tuple[int, ...]] = []
    real = xapian.Enquire.get_mset

    def spy(self: xapian.Enquire, *args: Any) -> Any:
        asked.append(args)
        return real(self, *args)

    monkeypatch.setattr(xapian.Enquire, "get_mset", spy)
    one_index.search(TREE, 10)
    one_index.search(TREE, 10, pruned=True)
    assert asked == [(0, 10, len(CASE["docs"])), (0, 10)]

    rt = local_router(docs, tmp_path, shards=2, settings='ranking = "pruned"\n')
    monkeypatch.setattr(LocalReads, "union_top", lambda *a: pytest.fail("the union searched under pruned ranking"))
    try:
        asked.clear()
        assert _hits(rt, ["library for parsing command line options"], top_k=4)[0]
        # each shard's ranking, pruned (and the snippets' empty MSet, snippets.py)
        assert [a for a in asked if a != (0, 0)] == [(0, 4), (0, 4)]
    finally:
        rt.local_reads.close()
