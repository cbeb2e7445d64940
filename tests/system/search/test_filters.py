"""Filters through real processes: 3 shards answer a filtered search exactly as one index
holding every document answers the unfiltered one, less the documents the filter excludes (ids
in order, scores within 1e-9 relative) — a filter selects and never scores; and a filter the
service cannot apply is a 400 naming it."""

from __future__ import annotations

import httpx
import pytest

from sluice.search.index.filters import decode_filter
from sluice.search.index.query_tree import resolve
from sluice.search.index.schema import Schema
from tests.system.search.cluster import ingest, start_router
from tests.unit.search.test_filters import FILTERS, RANGES, _passes, docs

CONFIG = """
[search]
shard_deadline_ms = 20000
range_fields = { year = "number", published = "date" }
[[shards]]
name = "a"
[[shards]]
name = "b"
[[shards]]
name = "c"
"""
QUERIES = ["package manager", "python", "+debian tool", "network OR graphics -library", "librar*", '"package manager"']


@pytest.fixture(scope="module")
def router(tmp_path_factory):
    r = start_router(tmp_path_factory.mktemp("filters"), CONFIG)
    try:
        ingest(r.url, docs(600, seed=9))
        yield r
    finally:
        r.stop()


def _search(url, body):
    return httpx.post(url + "/v1/search", json=body, timeout=60)


def test_three_shards_filter_like_one_index(router):
    from sluice.search.index.shard_index import ShardIndex

    documents = docs(600, seed=9)
    by_id = {d["id"]: d for d in documents}
    one = ShardIndex(None, Schema(ranges=RANGES))
    one.apply(
        1, [{"op": "upsert", "id": d["id"], "fields": {k: v for k, v in d.items() if k != "id"}} for d in documents]
    )
    checked = 0
    for flt in FILTERS:
        decode_filter(flt, RANGES)
        for q in QUERIES:
            got = _search(router.url, {"query": q, "top_k": 10, "filter": flt, "snippet_chars": 0})
            assert got.status_code == 200, got.text
            body = got.json()
            assert not body["partial"], body
            if q.endswith("*"):
                continue  # the reference has no wildcard expansion; the router's is checked elsewhere
            want = [h for h in one.search(resolve(q, one.analyzer), 1000) if _passes(by_id[h.doc_id], flt)][:10]
            assert [h["id"] for h in body["hits"]] == [h.doc_id for h in want], (q, flt)
            for g, w in zip(body["hits"], want):
                assert g["score"] == pytest.approx(w.score, rel=1e-9, abs=0), (q, flt)
            checked += len(want)
    assert checked > 300


@pytest.mark.parametrize(
    "flt,named",
    [
        ({"year": {"between": [1, 2]}}, "unknown operator 'between'"),
        ({"section": {"gte": 3}}, "filter.section: gte/lte need a range field declared"),
        ({"year": {"lte": "soon"}}, "filter.year.lte"),
        ("libs", "filter must be an object"),
    ],
)
def test_a_filter_the_service_cannot_apply_is_a_400_naming_it(router, flt, named):
    r = _search(router.url, {"query": "package", "filter": flt})
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    assert named in r.json()["error"]["message"], r.text


def test_a_document_whose_range_field_is_not_comparable_is_refused_by_line(router):
    r = httpx.post(
        router.url + "/v1/search/documents",
        timeout=60,
        content='{"id": "ok", "year": 2001}\n{"id": "bad", "year": "2001"}\n{"id": "bad2", "published": "soon"}',
    )
    assert r.status_code == 200 and [e["line"] for e in r.json()["errors"]] == [2, 3], r.text
