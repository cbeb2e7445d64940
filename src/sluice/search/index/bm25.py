"""BM25 scores that are equal on every shard: Xapian's own BM25, fed the global statistics.

Xapian's BM25Weight (1.4, k2 = 0) scores a document d for a query term t as

    idf(N, tf) · (k3+1)·wqf/(k3+wqf) · (k1+1)·wdf / (k1·((1-b) + b·max(len/avlen, mn)) + wdf)
    idf(N, tf) = log(x) with x = (N - tf + ½)/(tf + ½), and x ← x/2 + 1 when x < 2

where N, tf and avlen are the *local* database's. A shard holding part of the documents gets
other values, so its scores are not comparable with another shard's (the "per-shard
statistics" mode). Xapian 1.4 has no API to supply statistics, but both differences can be
undone exactly:
- avlen: with r = avlen_global / avlen_local, the weight's denominator with parameters
  k1' = k1·b/r + k1·(1-b), b' = (k1·b/r) / k1', mn' = mn·r is *identical* to the global one
  (k1'·(1-b') = k1·(1-b) and k1'·b'/avlen_local = k1·b/avlen_global), and the numerator's
  (k1'+1) differs by a constant factor;
- idf: a constant factor per term, idf_global / idf_local.
So each query term is wrapped in OP_SCALE_WEIGHT by (k1+1)/(k1'+1) · idf_global/idf_local and
the shard's Enquire uses BM25Weight(k1', 0, k3, b', mn'). The result equals one index holding
every document to within a few ulps (measured ≤ 6e-16 relative; tests check 1e-9), at the
price of one extra round trip (phase 1: each shard's N, total length and tf per term).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any


@dataclasses.dataclass(frozen=True, slots=True)
class Bm25Params:
    k1: float = 1.0
    k3: float = 1.0
    b: float = 0.5
    min_normlen: float = 0.5


@dataclasses.dataclass(slots=True)
class CollectionStats:
    """Documents, their summed length, and the document frequency of each asked term."""

    doc_count: int = 0
    total_length: int = 0
    term_freqs: dict[str, int] = dataclasses.field(default_factory=dict)

    def add(self, other: CollectionStats) -> None:
        self.doc_count += other.doc_count
        self.total_length += other.total_length
        for t, f in other.term_freqs.items():
            self.term_freqs[t] = self.term_freqs.get(t, 0) + f

    def to_json(self) -> dict[str, Any]:
        return {"doc_count": self.doc_count, "total_length": self.total_length, "term_freqs": self.term_freqs}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> CollectionStats:
        tf = d.get("term_freqs", {})
        if not isinstance(tf, dict) or not all(isinstance(k, str) and isinstance(v, int) for k, v in tf.items()):
            raise ValueError("term_freqs must map terms to integers")
        n, tl = d.get("doc_count"), d.get("total_length")
        if not isinstance(n, int) or not isinstance(tl, int) or n < 0 or tl < 0:
            raise ValueError("doc_count and total_length must be integers >= 0")
        return cls(n, tl, dict(tf))


def idf(n: int, tf: int) -> float:
    """Xapian 1.4 BM25Weight's term weight without a relevance set."""
    x = (n - tf + 0.5) / (tf + 0.5)
    if x < 2:
        x = x * 0.5 + 1
    return math.log(x)


@dataclasses.dataclass(frozen=True, slots=True)
class ShardWeighting:
    """What one shard uses to score with global statistics: the BM25 parameters of its Enquire
    and a factor per term (1.0 when it scores with its own statistics)."""

    k1: float
    k3: float
    b: float
    min_normlen: float
    term_factor: dict[str, float]


def local_weighting(p: Bm25Params) -> ShardWeighting:
    return ShardWeighting(p.k1, p.k3, p.b, p.min_normlen, {})


def global_weighting(p: Bm25Params, glob: CollectionStats, local: CollectionStats) -> ShardWeighting:
    """The shard's parameters and per-term factors that reproduce the global BM25 exactly."""
    if local.doc_count == 0 or local.total_length == 0 or glob.doc_count == 0 or glob.total_length == 0:
        return local_weighting(p)  # no term matches here: nothing to correct
    r = (glob.total_length / glob.doc_count) / (local.total_length / local.doc_count)
    k1 = p.k1 * p.b / r + p.k1 * (1 - p.b)
    b = (p.k1 * p.b / r) / k1 if k1 > 0 else p.b
    common = (p.k1 + 1) / (k1 + 1)
    factors = {}
    for term, ltf in local.term_freqs.items():
        gtf = glob.term_freqs.get(term, ltf)
        if ltf > 0:
            factors[term] = (
                common * idf(max(glob.doc_count, local.doc_count), max(gtf, ltf)) / idf(local.doc_count, ltf)
            )
    return ShardWeighting(k1, p.k3, b, p.min_normlen * r, factors)


# One-round search (router/query/global_stats/one_round.py): a shard scores the terms whose
# global frequency the router does not know yet with its own frequency in its place, and reports
# each such term's part of every hit's score, so that the router can correct the scores once the
# shards' answers give the global frequencies.


def leaf_weight(w: ShardWeighting, n_local: int, ltf: int, term: str) -> float:
    """Xapian BM25Weight's termweight for one leaf of `term` on this shard (wqf 1): the idf over
    the shard's own statistics times the leaf's OP_SCALE_WEIGHT factor (query_builder.py)."""
    f = w.term_factor.get(term)
    tw = idf(n_local, ltf) * (1.0 if f is None else f)
    if w.k3 != 0:
        tw *= (w.k3 + 1) / (w.k3 + 1)  # Xapian's (k3+1)·wqf/(k3+wqf) with wqf 1
    return tw


def leaf_part(w: ShardWeighting, termweight: float, wdf: int, length: int, len_factor: float) -> float:
    """Xapian BM25Weight::get_sumpart (k2 = 0): one leaf's part of a document's score."""
    normlen = max(length * len_factor, w.min_normlen)
    denom = w.k1 * (normlen * w.b + (1 - w.b)) + wdf
    return 0.0 if denom == 0 else termweight * (wdf * (w.k1 + 1) / denom)


def one_round_factor(n_glob: int, n_local: int, ltf: int, gtf: int) -> float:
    """What a term's part of a shard's score, computed with the shard's own frequency `ltf` in
    place of the global one (global_weighting() without it), is multiplied by to become exact
    once the global frequency `gtf` is known. At most 1: gtf ≥ ltf, and the idf falls as the
    frequency rises — so no document's exact score exceeds the score the shard ranked it by."""
    n = max(n_glob, n_local)
    return idf(n, max(gtf, ltf)) / idf(n, ltf)
