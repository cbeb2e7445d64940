"""A hit read from the index keeps its stored fields as JSON text: its id, its fields and the
router's answer must be what decoding the stored data would give, for any id and field text;
and the query built through the bindings' bare constructor is the one xapian.Query builds."""

from __future__ import annotations

import json

import pytest
import xapian

from sluice.search.contract import SearchResponse
from sluice.search.index.analyzer import Analyzer
from sluice.search.index.hits import Hit, merge, stored_hit
from sluice.search.index.query_builder import build_query
from sluice.search.index.query_tree import NodeKind
from sluice.search.index.schema import parse_document

IDS = [
    "plain-id",
    'quo"te',
    "back\\slash\\",
    'x","fields":{"a":1}',  # the separator's text inside the id
    "é ü 中文 🙂",
    "tab\there",
]
FIELDS = [
    {},
    {"title": "Packages", "body": 'a "quoted" \\ text, with ","fields": inside'},
    {"title": "ünïcödé 🙂", "n": 3, "x": 1.5, "tags": ["a", "b"], "nested": {"k": None}},
]


@pytest.mark.parametrize("doc_id", IDS)
@pytest.mark.parametrize("fields", FIELDS)
def test_a_stored_hit_decodes_as_the_stored_data_does(doc_id, fields):
    doc = Analyzer(None).document(parse_document({"id": doc_id, **fields}))
    data = doc.get_data()
    expected = json.loads(data)
    hit = stored_hit(data, 1.25)
    assert hit.doc_id == expected["id"] == doc_id
    assert isinstance(hit.stored, str)  # not decoded
    assert hit.fields == expected["fields"]
    assert json.loads(hit.json_text()) == {"id": doc_id, "score": 1.25, "fields": expected["fields"], "snippet": ""}


def test_data_of_another_shape_is_decoded_whole():
    hit = stored_hit(b'{"fields":{"a":1},"id":"z"}', 2.0)
    assert (hit.doc_id, hit.fields) == ("z", {"a": 1})


def test_an_answer_spliced_from_stored_text_is_the_answer_encoded_from_dicts():
    raw = stored_hit(Analyzer(None).document(parse_document({"id": 'a"1', "title": "é"})).get_data(), 3.0)
    hits = merge([[raw, Hit("b", 2.0, {"title": "x"}, "<b>x</b> &amp;")], [Hit("c", 2.5, {})]], 10)
    res = SearchResponse(hits, 2, 1, {"s1": "timeout"}, took_ms=1.23456, cached=False)
    assert json.loads(res.json_bytes()) == json.loads(json.dumps(res.to_json()))
    assert json.loads(SearchResponse([], 1, 1, {}).json_bytes()) == SearchResponse([], 1, 1, {}).to_json()
    # the summary written by hand is json's own text, byte for byte
    whole = SearchResponse([Hit("b", 2.0, {"t": "é"})], 2, 2, {}, took_ms=0.1 + 0.2, cached=True)
    assert whole.json_bytes() == json.dumps(whole.to_json(), separators=(",", ":"), ensure_ascii=False).encode()


def test_the_bare_constructor_builds_the_query_xapian_query_builds():
    Q = xapian.Query
    tree = (
        NodeKind.OR,
        [
            (NodeKind.TERM, "alpha"),
            (NodeKind.AND, [(NodeKind.TERM, "beta"), (NodeKind.PHRASE, ["gam", "del"])]),
            (NodeKind.AND_NOT, [(NodeKind.TERM, "eps"), (NodeKind.TERM, "zet")]),
        ],
    )
    factor = {"alpha": 1.5, "gam": 0.5}
    leaf = lambda t: Q(Q.OP_SCALE_WEIGHT, Q(t), factor[t]) if t in factor else Q(t)  # noqa: E731
    expected = Q(
        Q.OP_OR,
        [
            leaf("alpha"),
            Q(
                Q.OP_AND,
                [
                    leaf("beta"),
                    Q(Q.OP_FILTER, Q(Q.OP_AND, [leaf("gam"), leaf("del")]), Q(Q.OP_PHRASE, [Q("gam"), Q("del")])),
                ],
            ),
            Q(Q.OP_AND_NOT, [leaf("eps"), leaf("zet")]),
        ],
    )
    assert str(build_query(tree, factor)) == str(expected)


@pytest.mark.parametrize("score", [1.25, 0.1 + 0.2, 5.334786137463693, 1e-300, 1e22, -0.0, 3.0, float("inf")])
def test_a_hits_json_text_is_the_json_encoders_own(score):
    """json_text writes strings and scores without json's Python layers: byte for byte what the
    encoder writes (quotes, backslashes, controls, U+2028, astral characters, float reprs)."""
    odd = 'é"\\\n\u2028\x00 <b>x</b> \U0001d11e'
    hit = Hit(odd, score, {"t": odd}, odd)
    assert hit.json_text() == json.dumps(hit.to_json(), separators=(",", ":"), ensure_ascii=False)
