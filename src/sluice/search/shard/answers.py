"""A shard's answers to the query protocol's two requests, from one ShardIndex.

The same code answers for a replica process (shard/replica.py, under its index lock) and for a
cold shard the router opened from an archive (tiers/cold_tier.py, under that shard's lock), so
their statistics and scores are the same and merge exactly.
"""

from __future__ import annotations

from sluice.search.contract import ShardSearchAnswer, ShardSearchRequest, StatsAnswer, StatsRequest
from sluice.search.index.query_tree import scored_leaves
from sluice.search.index.shard_index import ShardIndex


def stats_answer(index: ShardIndex, req: StatsRequest, applied_seq: int) -> StatsAnswer:
    return StatsAnswer(index.stats(req.terms), applied_seq, {p: index.expand(p) for p in req.prefixes})


def search_answer(index: ShardIndex, req: ShardSearchRequest, applied_seq: int) -> ShardSearchAnswer:
    if req.vector is not None:
        return ShardSearchAnswer(index.dense_search(req.vector, req.top_k, req.exact, req.filter), applied_seq)
    if req.unknown is None:
        return ShardSearchAnswer(
            index.search(req.tree, req.top_k, req.stats, clauses=req.filter, pruned=req.pruned), applied_seq
        )
    scored = scored_leaves(req.tree)  # the contract checked: a tree whose terms all add weight, global stats
    assert req.tree is not None and req.stats is not None and scored is not None
    hits, freqs, parts = index.search_with_parts(
        req.tree, req.top_k, req.stats, req.unknown, scored, clauses=req.filter, pruned=req.pruned
    )
    return ShardSearchAnswer(hits, applied_seq, term_freqs=freqs, parts=parts)
