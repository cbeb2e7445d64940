"""Trailing wildcards across shards: one expansion, the union of every shard's.

The router asks each shard, in the statistics round, for the index terms that start with each
wildcard's prefix (ShardIndex.expand: what Xapian's OP_WILDCARD expands to) and their document
frequencies. The union over the shards is what one index holding every document would expand
to; query_tree.expand puts it in the tree as an OR of plain terms, and every shard then scores
those same terms with their global statistics — a shard that lacks a term has frequency 0 for
it — so the merged scores stay exact. A wildcard whose union passes MAX_WILDCARD_TERMS is a
query syntax error at its position (make it longer), as is an expansion too large to send.
"""

from __future__ import annotations

from collections.abc import Sequence

from sluice.search.errors import QuerySyntaxError
from sluice.search.index.bm25 import CollectionStats
from sluice.search.index.query_tree import MAX_TREE_NODES, ResolvedQuery, Tree, expand, size
from sluice.search.index.shard_index import MAX_WILDCARD_TERMS

Expansions = dict[str, dict[str, int]]  # prefix term → {term: document frequency} (one shard's)


def union(per_shard: Sequence[Expansions], resolved: ResolvedQuery) -> dict[str, list[str]]:
    """Each prefix's terms over every shard, sorted; QuerySyntaxError when one has too many."""
    out: dict[str, list[str]] = {}
    for prefix, at in resolved.wildcards.items():
        terms: set[str] = set()
        for exp in per_shard:
            terms.update(exp.get(prefix, ()))
        if len(terms) > MAX_WILDCARD_TERMS:
            raise QuerySyntaxError(at, f"this wildcard matches more than {MAX_WILDCARD_TERMS} terms; make it longer")
        out[prefix] = sorted(terms)
    return out


def expanded_tree(resolved: ResolvedQuery, terms: dict[str, list[str]]) -> Tree | None:
    tree = expand(resolved.tree, terms)
    if size(tree) > MAX_TREE_NODES:
        at = min(resolved.wildcards.values(), default=0)
        raise QuerySyntaxError(
            at, f"the wildcards match too many terms together (at most {MAX_TREE_NODES} query nodes); make them longer"
        )
    return tree


def with_expanded_freqs(stats: CollectionStats, exp: Expansions, terms: dict[str, list[str]]) -> CollectionStats:
    """A shard's statistics plus its frequency of every expanded term (0 where it has none)."""
    for prefix, union_terms in terms.items():
        mine = exp.get(prefix, {})
        for t in union_terms:
            stats.term_freqs[t] = mine.get(t, 0)
    return stats
