"""Filters (index/filters.py): decoding with errors that name the problem, and selection that
never changes a score (a filtered answer is the unfiltered one less what it excludes)."""

from __future__ import annotations

import random

import pytest

from sluice.search.contract import SearchRequest
from sluice.search.errors import SearchError
from sluice.search.index.filters import FilterError, decode_filter, url_domains
from sluice.search.index.query_tree import resolve
from sluice.search.index.schema import RangeKind, Schema
from sluice.search.index.shard_index import ShardIndex

RANGES = {"year": RangeKind.NUMBER, "published": RangeKind.DATE}


def docs(n=300, seed=3):
    rng = random.Random(seed)
    words = ["apt", "package", "manager", "python", "library", "tool", "debian", "network", "graphics"]
    out = []
    for i in range(n):
        d = {
            "id": f"d{i}",
            "title": " ".join(rng.choices(words, k=3)),
            "body": " ".join(rng.choices(words, k=20)),
            "section": rng.choice(["libs", "net", "utils", "3"]),
            "year": rng.randint(1995, 2025),
            "published": f"20{rng.randint(10, 24)}-0{rng.randint(1, 9)}-1{rng.randint(0, 9)}",
            "tags": rng.sample(["cli", "gui", "web", "db"], k=rng.randint(0, 2)),
            "stable": rng.random() < 0.5,
            "url": rng.choice(
                [
                    "https://docs.example.com/a",
                    "https://example.com/b",
                    "http://api.example.org/c",
                    "https://www.debian.org/d",
                ]
            ),
        }
        if i % 10 == 0:
            del d["year"]
        out.append(d)
    return out


def _index(documents):
    ix = ShardIndex(None, Schema(ranges=RANGES))
    ix.apply(
        1, [{"op": "upsert", "id": d["id"], "fields": {k: v for k, v in d.items() if k != "id"}} for d in documents]
    )
    return ix


def _passes(d, flt):
    for field, cond in flt.items():
        value = d.get(field)
        have = value if isinstance(value, list) else [value]
        if field == "url.domain":
            have = url_domains(d["url"])
        if not isinstance(cond, dict):
            cond = {"in": [cond]}
        if "in" in cond and not any(v in have and type(v) is type(h) for v in cond["in"] for h in have if h == v):
            return False
        if "not_in" in cond and any(v in have for v in cond["not_in"]):
            return False
        if "gte" in cond or "lte" in cond:
            if field not in d:
                return False
            if "gte" in cond and d[field] < cond["gte"] or "lte" in cond and d[field] > cond["lte"]:
                return False
    return True


FILTERS = [
    {"section": "libs"},
    {"section": {"in": ["net", "utils"]}},
    {"section": {"not_in": ["libs"]}, "stable": True},
    {"tags": "cli"},
    {"year": {"gte": 2000, "lte": 2010}},
    {"year": {"gte": 2015}, "section": {"not_in": ["net"]}},
    {"published": {"gte": "2015-01-01", "lte": "2019-12-31T23:59:59Z"}},
    {"url.domain": {"in": ["example.com"]}},
    {"url.domain": {"not_in": ["example.com"]}},
    {"url.domain": "docs.example.com"},
    {"section": "3"},
    {"section": 3},
]


@pytest.mark.parametrize("flt", FILTERS)
def test_a_filtered_answer_is_the_unfiltered_one_less_what_it_excludes(flt):
    documents = docs()
    by_id = {d["id"]: d for d in documents}
    ix = _index(documents)
    clauses = decode_filter(flt, RANGES)
    for q in ("package manager", "python", "+debian tool", "network OR graphics -library"):
        tree = resolve(q, ix.analyzer)
        everything = ix.search(tree, 1000)
        want = [h for h in everything if _passes(by_id[h.doc_id], flt)][:10]
        got = ix.search(tree, 10, clauses=clauses)
        assert [(h.doc_id, h.score) for h in got] == [(h.doc_id, h.score) for h in want], (q, flt)
    assert flt == {"section": 3} or any(ix.search(resolve("package", ix.analyzer), 10, clauses=clauses)), flt


@pytest.mark.parametrize(
    "flt,problem",
    [
        ({"year": {"between": [1, 2]}}, "filter.year: unknown operator 'between'"),
        ({"section": {"gte": "a"}}, "filter.section: gte/lte need a range field declared"),
        ({"year": {"gte": "x"}}, "filter.year.gte: a number is required"),
        ({"published": {"lte": "yesterday"}}, "filter.published.lte: 'yesterday' is not an ISO 8601 date"),
        ({"section": {"in": []}}, "filter.section.in: a list of 1 to 256 values"),
        ({"section": {"in": [["x"]]}}, "filter.section.in: a value is a string, a number or a boolean"),
        ({"section": {}}, "filter.section: an empty condition"),
        ({"Bad-Name": 1}, "filter: 'Bad-Name' is not a field name"),
        (["section"], "filter must be an object"),
    ],
)
def test_bad_filters_are_refused_naming_the_problem(flt, problem):
    with pytest.raises(FilterError) as exc:
        decode_filter(flt, RANGES)
    assert str(exc.value).startswith(problem), str(exc.value)
    with pytest.raises(SearchError) as err:
        SearchRequest.decode(b'{"query": "x", "filter": %s}' % __import__("json").dumps(flt).encode(), 100, RANGES)
    assert err.value.status == 400 and err.value.message.startswith(problem)


def test_url_domains_are_the_host_and_the_domains_above_it():
    assert url_domains("https://Docs.Example.com:8443/x?y") == ["docs.example.com", "example.com"]
    assert url_domains("http://localhost/") == ["localhost"]
    assert url_domains("not a url") == [] and url_domains(None) == []


def test_a_range_field_that_is_not_a_number_is_refused_at_ingest():
    from sluice.search.errors import DocumentError

    with pytest.raises(DocumentError, match="'year' is a number range field"):
        _index([{"id": "x", "year": "1999"}])
