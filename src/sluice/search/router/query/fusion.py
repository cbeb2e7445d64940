"""Hybrid retrieval: one ranking from a lexical (BM25) and a dense (cosine) ranking.

- **rrf** (the default): reciprocal rank fusion, score(d) = Σ wᵢ / (k + rankᵢ(d)) over the lists
  d is in, ranks from 1, k = 60 — Elasticsearch's `rrf` retriever's rank_constant — and the
  weights (1 − dense_weight, dense_weight) × 2, so the default dense_weight 0.5 is plain RRF
  (both 1). Ranks only: BM25 and cosine scores live on different scales.
- **weighted**: each list's scores min-max normalized to [0, 1] within the window (a document
  absent from a list scores 0 there), then (1 − dense_weight)·lexical + dense_weight·dense —
  OpenSearch's min_max + arithmetic_mean, Meilisearch's semanticRatio.

Each list is the exact merged top `window` of its kind across every shard, so the fused
ranking is one index's too. Ties are ordered by document id; the fused score is the hit's score.
"""

from __future__ import annotations

from sluice.search.index.hits import Hit, merge
from sluice.search.retrieval import RRF_K, Fusion


def fuse(
    lexical: list[Hit],
    dense: list[Hit],
    top_k: int,
    fusion: Fusion = Fusion.RRF,
    rrf_k: int = RRF_K,
    dense_weight: float = 0.5,
) -> list[Hit]:
    weights = (1.0 - dense_weight, dense_weight)
    scores: dict[str, float] = {}
    first: dict[str, Hit] = {}
    for hits, weight in zip((lexical, dense), weights):
        if fusion is Fusion.RRF:
            parts = [2 * weight / (rrf_k + rank) for rank in range(1, len(hits) + 1)]
        else:
            parts = [weight * s for s in _min_max([h.score for h in hits])]
        for hit, part in zip(hits, parts):
            scores[hit.doc_id] = scores.get(hit.doc_id, 0.0) + part
            first.setdefault(hit.doc_id, hit)
    return merge([[first[d].rescored(s) for d, s in scores.items()]], top_k)


def _min_max(scores: list[float]) -> list[float]:
    if not scores:
        return []
    lo, hi = min(scores), max(scores)
    return [1.0 if hi == lo else (s - lo) / (hi - lo) for s in scores]
