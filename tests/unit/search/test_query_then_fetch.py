"""Query then fetch in the router's process (tiers/local_reads.py LocalReads.top): every local
shard ranks its top_k without reading a document, and only the merged top_k documents are read.
The answers equal the search round's (every shard's top_k read, then merged) on the corpus's
queries, byte for byte; a revision moved under the read is read again, and a reader that cannot
answer sends the query to the round. (A query without wildcards over local shards is one search
of their union, test_exact_ranking.py; here that way is closed, so every query takes this one,
as a query with wildcards does.)"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
import xapian

from sluice.search.index.query_tree import resolve
from sluice.search.index.shard_index import ShardIndex
from tests import corpus
from tests.local_search_router import answers, local_router


@pytest.fixture(scope="module")
def docs() -> list[dict]:
    return corpus.documents(600)


@pytest.fixture(scope="module")
def queries(docs: list[dict]) -> list[str]:
    titles = dict.fromkeys(" ".join(re.findall(r"\w+", d["title"])) for d in docs if d.get("title"))
    # the benches' queries (package summaries), the corpus's mix (phrases, +required, fields), operators
    mix = corpus.queries(docs, 100)
    return [t for t in titles if t][:100] + mix + ["python AND library", '"package manager"', "graph*", "-x +lib*"]


def _query_then_fetch(rt: Any) -> Any:
    rt.searcher.fan_out.local_union = lambda *a: None  # not the union's search: query then fetch
    return rt


def test_answers_equal_the_rounds_and_only_the_returned_documents_are_read(docs, queries, tmp_path, monkeypatch):
    rt = _query_then_fetch(local_router(docs, tmp_path / "a"))
    fetched: list[str] = []
    real_fetched = ShardIndex.fetched

    def counting_fetched(self: ShardIndex, hit: Any, docid: int) -> Any:
        fetched.append(hit.doc_id)
        return real_fetched(self, hit, docid)

    def no_search(*a: Any, **k: Any) -> Any:
        raise AssertionError("a search round's documents were read")

    monkeypatch.setattr(ShardIndex, "fetched", counting_fetched)
    monkeypatch.setattr(ShardIndex, "search", no_search)
    try:
        got = answers(rt, queries, top_k=10, snippet_chars=120)
        filtered = answers(rt, queries[:20], top_k=5, filter={"section": {"not_in": ["libs"]}})
    finally:
        rt.local_reads.close()
    monkeypatch.undo()
    # the returned documents, once each (a repeated query is the result cache's answer: none)
    assert fetched == [h["id"] for g in got + filtered if not g["cached"] for h in g["hits"]]
    assert sum(bool(g["hits"]) for g in got) >= 100 and any(len(g["hits"]) == 10 for g in got)

    before = _query_then_fetch(local_router(docs, tmp_path / "b"))
    before.searcher.fan_out.local_top = lambda *a: None  # every query by the round
    try:
        assert answers(before, queries, top_k=10, snippet_chars=120) == got
        assert answers(before, queries[:20], top_k=5, filter={"section": {"not_in": ["libs"]}}) == filtered
    finally:
        before.local_reads.close()


def test_a_revision_moved_under_the_read_is_read_again_and_a_reader_that_cannot_answer_goes_to_the_round(
    docs, queries, tmp_path, monkeypatch
):
    rt = _query_then_fetch(local_router(docs, tmp_path))
    real_ranked, failures = ShardIndex.ranked, [1]

    def moving(self: ShardIndex, *a: Any) -> Any:
        if failures[0] > 0:
            failures[0] -= 1
            raise xapian.DatabaseModifiedError("the writer reused the blocks")
        return real_ranked(self, *a)

    monkeypatch.setattr(ShardIndex, "ranked", moving)
    local = rt.local_reads
    try:
        want = answers(rt, queries[:1])[0]
        assert want["hits"] and local.fell_back == 0  # read again: answered
        failures[0] = 2  # moved twice: the round answers (the same search, each shard's top_k read)
        again = answers(rt, queries[:1], top_k=9)[0]  # another top_k: not the result cache's answer
        assert local.fell_back == 1 and again["hits"] == want["hits"][:9] and again["cached"] is False
    finally:
        local.close()


def test_a_document_without_its_id_value_is_ranked_by_reading_it():
    """Every document sluice writes carries its id as a value (the sort key `ranked` reads); one
    without (written by hand) is read for its id when ranked, and fetched as it was read."""
    ix = ShardIndex(None)
    ix.apply(1, [{"op": "upsert", "id": "a", "fields": {"title": "gravel road"}}])
    bare = xapian.Document()
    bare.set_data(json.dumps({"id": "b", "fields": {"title": "gravel path"}}))
    bare.add_term("gravel")
    ix.db.add_document(bare)
    ranked = ix.ranked(resolve("gravel", ix.analyzer), 10, None, None)
    assert sorted(h.doc_id for h, _ in ranked) == ["a", "b"]
    fetched = {h.doc_id: ix.fetched(h, docid).fields for h, docid in ranked}
    assert fetched == {"a": {"title": "gravel road"}, "b": {"title": "gravel path"}}
