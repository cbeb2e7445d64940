"""Exact global scores in one round trip when only some terms' statistics are new.

The router knows every shard's document count and total length at its current entry (the
statistics cache, stats_cache.py) and the global frequency of most terms; for a query with
terms it has never asked about, two rounds would be needed (statistics, then search). Instead
the search goes out at once with the global statistics it knows; each shard scores the unknown
terms with its own document frequency in place of the global one, and answers its top-k, its
frequency of each unknown term, and each unknown term's part of every hit's score
(index/shard_index.py search_with_parts). The sums of the shards' frequencies are the global
ones, so each hit's exact score is its score minus, per unknown term, its part × (1 − factor)
(bm25.one_round_factor).

Why this is exact and when it is not enough: the factor is at most 1 (a global frequency is at
least a shard's, and the idf falls as the frequency rises), so no document's exact score
exceeds the score its shard ranked it by. A document a shard did not return ranked below that
shard's k-th hit, so its exact score is at most that k-th hit's shard score — times the largest
factor among the query's scored terms, when all of them are unknown (the parts scale at most by
that). If every shard that returned k hits has that bound below the k-th exact score of the
merge, no document left out can enter the top k: the merge is the exact top k. Otherwise (or when a shard's entry
moved, or a tree has phrases, whose terms weigh only where the phrase matches) the router asks
again with the now complete statistics — a second round, as before, and never a wrong answer.
Only queries whose every scored term adds its weight wherever it occurs qualify
(query_tree.scored_leaves).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from sluice.search.index.bm25 import one_round_factor
from sluice.search.index.hits import Hit, merge_rescored

# a margin above the merge's tie rounding (12 significant digits, hits.py): a left-out document
# scoring within it of the k-th could tie with it and be ordered before it by id
TIE_MARGIN = 1e-9


@dataclasses.dataclass(slots=True)
class ShardAnswer:
    hits: list[Hit]  # ranked by the shard's scores
    parts: list[dict[str, float]]  # per hit: each unknown term's part of its score
    term_freqs: dict[str, int]  # the shard's frequency of each unknown term
    doc_count: int  # the shard's document count (the cache's, at the shard's entry)


def global_freqs(answers: list[ShardAnswer]) -> dict[str, int]:
    out: dict[str, int] = {}
    for a in answers:
        for t, f in a.term_freqs.items():
            out[t] = out.get(t, 0) + f
    return out


def exact_top_k(
    answers: list[ShardAnswer], n_glob: int, top_k: int, scored: Sequence[str], asked: int | None = None
) -> list[Hit] | None:
    """The exact merged top_k, or None when a document no shard returned could belong in it.
    `scored`: the terms that add weight (query_tree.scored_leaves); `asked`: how many hits each
    shard was asked for (top_k by default; more makes the bound below tighter)."""
    asked = top_k if asked is None else asked
    gtf = global_freqs(answers)
    candidates: list[tuple[float, Hit]] = []  # (exact score, the shard's hit)
    bound = None  # the most a document left out by a shard that may hold more could score
    for a in answers:
        factor = {t: one_round_factor(n_glob, a.doc_count, f, gtf[t]) for t, f in a.term_freqs.items() if f > 0}
        for hit, parts in zip(a.hits, a.parts):
            score = hit.score
            for t, part in parts.items():
                score -= part * (1.0 - factor[t])
            candidates.append((score, hit))
        if a.hits and len(a.hits) >= asked:
            # a left-out document's exact score is its shard score with each term's part scaled
            # by that term's factor (1 for a known term; an unknown term absent here adds nothing)
            scale = _largest_factor(factor, scored, a.term_freqs)
            kth = a.hits[-1].score * scale
            bound = kth if bound is None else max(bound, kth)
    merged = merge_rescored(candidates, top_k)
    if bound is not None and (len(merged) < top_k or bound * (1 + TIE_MARGIN) >= merged[-1].score):
        return None
    return merged


def _largest_factor(factor: dict[str, float], scored: Sequence[str], freqs: dict[str, int]) -> float:
    """The largest factor among the scored terms that occur on the shard (1 for a known term;
    1 when none): a loop, not a generator into max() (~2 µs a shard less)."""
    largest = None
    for t in scored:
        if freqs.get(t, 1) > 0:
            f = factor.get(t, 1.0)
            if largest is None or f > largest:
                largest = f
    return 1.0 if largest is None else largest
