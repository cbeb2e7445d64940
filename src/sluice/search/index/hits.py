"""One search hit, and the merge of many shards' hits into one ranked list.

Ties: every shard orders equal scores by document id (Xapian sorts by relevance, then by the id
value slot), and the merge compares scores rounded to 12 significant digits, then ids. Scores
computed on different shards can differ in the last bits (≤ 1e-15 relative) where one index
would give the same number; without the rounding, that noise would reorder tied documents.
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


def rank_key(hit: Hit) -> tuple[float, str]:
    s = hit.score
    rounded = float(f"{s:.12g}") if math.isfinite(s) else s
    return (-rounded, hit.doc_id)


def merge(per_shard: Iterable[list[Hit]], top_k: int) -> list[Hit]:
    """The top_k of the shards' lists (each already ranked), by score then id."""
    return heapq.nsmallest(top_k, (h for hits in per_shard for h in hits), key=rank_key)
