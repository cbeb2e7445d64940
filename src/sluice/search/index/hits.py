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
import heapq
import math
from collections.abc import Iterable
from typing import Any


@dataclasses.dataclass(frozen=True, slots=True)
class Hit:
    doc_id: str
    score: float
    fields: dict[str, Any]

    def to_json(self) -> dict[str, Any]:
        return {"id": self.doc_id, "score": self.score, "fields": self.fields}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "Hit":
        return cls(str(d["id"]), float(d["score"]), dict(d.get("fields") or {}))


REPORTED_DIGITS = 12


def reported_score(score: float) -> float:
    """The score a hit is reported and ordered by: rounded to REPORTED_DIGITS significant digits."""
    return float(f"{score:.{REPORTED_DIGITS}g}") if math.isfinite(score) else score


def rank_key(hit: Hit) -> tuple[float, str]:
    return (-reported_score(hit.score), hit.doc_id)


def merge(per_shard: Iterable[list[Hit]], top_k: int) -> list[Hit]:
    """The top_k of the shards' lists, by reported score (highest first) then id, each hit
    carrying its reported score."""
    best = heapq.nsmallest(top_k, (h for hits in per_shard for h in hits), key=rank_key)
    return [Hit(h.doc_id, reported_score(h.score), h.fields) for h in best]
