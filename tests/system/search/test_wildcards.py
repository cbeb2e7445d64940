"""Trailing wildcards through real processes (issue 40): 3 shards answer a wildcard exactly as
one index holding every document does with Xapian's own wildcard expansion (OP_WILDCARD, terms
OR'ed), ids in order and scores within 1e-9; the query language's documented example runs; a
prefix is never stemmed (`pythones*` does not match `python`); a misplaced or too broad
wildcard is a query syntax error at its position."""

from __future__ import annotations

import json
import re
from collections import Counter

import pytest
import xapian

from sluice.search.index.analyzer import ID_SLOT
from sluice.search.index.bm25 import Bm25Params
from sluice.search.index.hits import Hit, merge
from sluice.search.index.query_tree import expand, resolve_query
from sluice.search.index.schema import parse_document
from sluice.search.index.shard_index import MAX_WILDCARD_TERMS, ShardIndex
from tests import corpus
from tests.system.search.cluster import ingest, search, start_router

N_DOCS = 1500
CONFIG = '[search]\nshard_deadline_ms = 20000\n[[shards]]\nname = "a"\n[[shards]]\nname = "b"\n[[shards]]\nname = "c"\n'
DOC_EXAMPLE = 'python AND (packag* OR "package manager") -title:library +body:tool'


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    docs = corpus.documents(N_DOCS)
    one = ShardIndex(None)
    for seq, d in enumerate(docs, 1):
        src = parse_document(d)
        one.apply(seq, [{"op": "upsert", "id": src.doc_id, "fields": src.fields}])
    router = start_router(tmp_path_factory.mktemp("wildcards"), CONFIG)
    try:
        ingest(router.url, docs)
        yield router, one, docs
    finally:
        router.stop()


def _xapian_wildcard(one: ShardIndex, prefix: str, k: int = 10) -> list[Hit]:
    """Xapian alone on one index: OP_WILDCARD expanded with OP_OR, BM25 as the shards use it."""
    p = Bm25Params()
    enquire = xapian.Enquire(one.db)
    enquire.set_weighting_scheme(xapian.BM25Weight(p.k1, 0, p.k3, p.b, p.min_normlen))
    enquire.set_sort_by_relevance_then_value(ID_SLOT, False)
    enquire.set_query(
        xapian.Query(xapian.Query.OP_WILDCARD, prefix, 0, xapian.Query.WILDCARD_LIMIT_ERROR, xapian.Query.OP_OR)
    )
    return merge([[Hit(json.loads(m.document.get_data())["id"], m.weight, {}) for m in enquire.get_mset(0, k)]], k)


def _one_index(one: ShardIndex, query: str, k: int = 10) -> list[Hit]:
    """Our query language on one index, each wildcard expanded by that index alone."""
    q = resolve_query(query, one.analyzer)
    tree = expand(q.tree, {p: sorted(one.expand(p)) for p in q.wildcards})
    return merge([one.search(tree, k)], k)


def _same(got: dict, want: list[Hit], what: str) -> None:
    assert not got["partial"], got
    assert [h["id"] for h in got["hits"]] == [h.doc_id for h in want], what
    for g, w in zip(got["hits"], want):
        assert g["score"] == pytest.approx(w.score, rel=1e-9, abs=0), what


def _prefixes(one: ShardIndex, docs: list[dict], n: int) -> list[str]:
    words = Counter(w for d in docs for w in re.findall(r"[a-z]{6,}", (d["title"] + " " + d["body"]).lower()))
    out: list[str] = []
    for w, _ in words.most_common():
        p = w[:4]
        if p not in out and 2 <= len(one.expand(p)) <= MAX_WILDCARD_TERMS:
            out.append(p)
        if len(out) == n:
            break
    return out


def test_a_wildcard_merges_exactly_like_xapians_own_expansion_on_one_index(setup):
    router, one, docs = setup
    prefixes = _prefixes(one, docs, 25)
    assert len(prefixes) == 25
    with_hits = 0
    for p in prefixes:
        want = _xapian_wildcard(one, p)
        _same(search(router.url, f"{p}*").json(), want, p)
        with_hits += bool(want)
        _same(search(router.url, f"title:{p}*").json(), _one_index(one, f"title:{p}*"), p)
    assert with_hits == 25
    mixed = [
        f"{prefixes[0]}* {prefixes[1]}*",
        f"+{prefixes[2]}* -{prefixes[3]}",
        f'{prefixes[4]}* "package manager"',
        DOC_EXAMPLE,
        "packag*",
    ]
    for q in mixed:
        _same(search(router.url, q).json(), _one_index(one, q), q)
    assert search(router.url, "packag*").json()["hits"]  # the documented example's wildcard finds documents


def test_a_prefix_is_never_stemmed(setup):
    router, one, _ = setup
    assert one.expand("python") and not one.expand("pythones")
    assert search(router.url, "pythones").json()["hits"]  # the word stems to python...
    assert search(router.url, "pythones*").json()["hits"] == []  # ...the prefix does not
    assert search(router.url, "python*").json()["hits"]


@pytest.mark.parametrize(
    "query,position,says",
    [
        ("pa*ck", 2, "only at the end"),
        ('"packag* manager"', 7, "inside a phrase"),
        ("python *", 7, "needs a word"),
        ("python a*", 7, f"more than {MAX_WILDCARD_TERMS} terms"),
    ],
)
def test_a_misplaced_or_too_broad_wildcard_is_a_syntax_error(setup, query, position, says):
    router, _, _ = setup
    r = search(router.url, query)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "query_syntax_error" and err["position"] == position and says in err["message"], err
