"""One search hit, and the merge of many shards' hits into one ranked list.

The score a hit is reported with is its score rounded to 12 significant digits, and hits are
ordered by exactly that reported score, highest first, then by document id — so a client that
sorts the hits again by (score desc, id) gets the same order. Why round: scores computed on
different shards differ in the last bits (≤ 1e-15 relative) where one index would give the same
number; ordered by the raw floats, that noise would decide the order of tied documents (and
differ from one index's), and reported raw, equal-looking scores would come back "unsorted"
(5.334786137463693 before 5.334786137463695). Every shard orders its own ties by id too (Xapian
sorts by relevance, then by the id value slot).
"""

from __future__ import annotations

import dataclasses
import json
import math
import operator
from collections.abc import Iterable
from typing import Any


# not frozen: a frozen dataclass sets each field through object.__setattr__ (~0.5 µs a hit
# against ~0.16 µs), and a query makes a hit per shard candidate and per merged result; nothing
# changes a hit after it is made (a new score is a new hit: `rescored`), cached answers included
@dataclasses.dataclass(slots=True)
class Hit:
    doc_id: str
    score: float
    # the stored fields: a dict, or their JSON text as the index stores it (a local read's hit),
    # decoded only when read (`fields`) and spliced as is into an answer (`json_text`): of the
    # N shards' top-k only the merged top-k are returned, and an answer needs no dict of them
    stored: dict[str, Any] | str
    snippet: str = ""  # the matched passage, marked and HTML-escaped (snippets.py); "" when not asked

    @property
    def fields(self) -> dict[str, Any]:
        s = self.stored
        return s if isinstance(s, dict) else json.loads(s)

    def to_json(self) -> dict[str, Any]:
        return {"id": self.doc_id, "score": self.score, "fields": self.fields, "snippet": self.snippet}

    def stored_text(self) -> str:
        """The stored fields' JSON text (non-ASCII characters as they are, or escaped where the
        index stored them escaped: the same JSON value)."""
        s = self.stored
        return s if isinstance(s, str) else _dumps(s)

    def json_text(self) -> str:
        """to_json()'s JSON text."""
        stored = self.stored_text()
        score = self.score
        # what _dumps writes for a string or a finite float, without its Python layers (~4 µs a
        # hit under load): json's own C string encoder, and the float's repr as json writes it
        number = float.__repr__(score) if math.isfinite(score) else _dumps(score)
        return f'{{"id":{_string(self.doc_id)},"score":{number},"fields":{stored},"snippet":{_string(self.snippet)}}}'

    def rescored(self, score: float) -> Hit:
        return Hit(self.doc_id, score, self.stored, self.snippet)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Hit:
        snippet = d.get("snippet", "")
        if not isinstance(snippet, str):
            raise ValueError("a hit's snippet is a string")
        return cls(str(d["id"]), float(d["score"]), dict(d.get("fields") or {}), snippet)


_dumps = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode
_string = json.encoder.encode_basestring  # what _dumps(str) returns (ensure_ascii=False): the C encoder
_STORED_HEAD, _STORED_FIELDS = '{"id":"', '","fields":'


def stored_hit(data: bytes, score: float) -> Hit:
    """A hit from a document's stored data, `{"id":"…","fields":{…}}` (analyzer.py), without
    decoding its fields. Inside a JSON string every `"` is escaped, so the first `","fields":`
    ends the id; data of any other shape is decoded whole."""
    text = data.decode()
    end = text.find(_STORED_FIELDS, len(_STORED_HEAD)) if text.startswith(_STORED_HEAD) else -1
    if end < 0 or not text.endswith("}"):
        d = json.loads(text)
        return Hit(d["id"], score, d.get("fields", {}))
    doc_id = text[len(_STORED_HEAD) : end]
    if "\\" in doc_id:
        doc_id = json.loads(text[len(_STORED_HEAD) - 1 : end + 1])
    return Hit(doc_id, score, text[end + len(_STORED_FIELDS) : -1])


REPORTED_DIGITS = 12
_REPORTED = f"%.{REPORTED_DIGITS}g"
_RANK = operator.itemgetter(0, 1)  # (−reported score, id)
_RAW = operator.itemgetter(0)


def reported_score(score: float) -> float:
    """The score a hit is reported and ordered by: rounded to REPORTED_DIGITS significant digits."""
    return float(_REPORTED % score) if math.isfinite(score) else score


def rank_key(hit: Hit) -> tuple[float, str]:
    return (-reported_score(hit.score), hit.doc_id)


def _top(items: list[tuple[float, str, Hit]], top_k: int) -> list[tuple[float, str, Hit]]:
    """The top_k of (−raw score, id, hit) in rank order — by reported score, then id — each item
    carrying its reported score negated in place of the raw one.

    Rounding never reverses an order (a > b ⇒ reported(a) ≥ reported(b)), so after a sort by the
    raw scores only equal reported scores can be out of order: the top_k, extended by every
    item whose reported score equals the k-th's, holds the answer, and only those items' scores
    are rounded (~0.5 µs each: the shards' other candidates, about half, never are)."""
    items.sort(key=_RAW)
    n = len(items)
    if n > top_k > 0:
        last = reported_score(-items[top_k - 1][0])
        while top_k < n and reported_score(-items[top_k][0]) == last:
            top_k += 1
    head = [(-reported_score(-neg), doc_id, h) for neg, doc_id, h in items[:top_k]]
    head.sort(key=_RANK)
    return head


def merge(per_shard: Iterable[list[Hit]], top_k: int) -> list[Hit]:
    """The top_k of the shards' lists, by reported score (highest first) then id, each hit
    carrying its reported score."""
    items = [(-h.score, h.doc_id, h) for hits in per_shard for h in hits]
    return [h if h.score == -neg else h.rescored(-neg) for neg, _, h in _top(items, top_k)[:top_k]]


def merge_rescored(scored: Iterable[tuple[float, Hit]], top_k: int) -> list[Hit]:
    """merge's top_k of hits given each with a new score (the one-round search's corrected
    ones): a hit is made only for each of the top_k returned, not for every candidate."""
    items = [(-score, h.doc_id, h) for score, h in scored]
    return [h.rescored(-neg) for neg, _, h in _top(items, top_k)[:top_k]]
