"""A ranking's top_k from Xapian: every matching document scored (`exact`, the default), or
Xapian's early termination (`pruned`, search.toml `ranking = "pruned"`).

Why: Xapian 1.4's matcher prunes — once it holds top_k candidates, a subquery whose maximum
weight cannot lift a document above the k-th is turned from OR into AND_MAYBE or AND — and that
pruning is not safe. On 3,000 Debian package descriptions, queried by each package's one-line
summary, it dropped a document that belongs in the top 10 (or top 3) in 4 of 3,000 rankings on
one index (a higher-scoring document missing, a lower one in its place), and in 2–5 over the
same documents opened as 2–4 sub-databases of one Database; with every document scored, the
answers equal a brute-force BM25 over the same postings. Seen with Debian's 1.4.22 and PyPI's
1.4.26, for BM25 with any b (k1 = 0, TF-IDF and the language-model weights were not affected).
`tests/unit/search/test_exact_ranking.py` holds one such ranking (the postings of a 4-term query
over the 3,000 documents, no text) and checks sluice's answer against brute force.

So by default the matcher is asked to check every document (`check_at_least` = the database's
document count): it then never raises its minimum weight while matching, and nothing is pruned.
The price is the pruning's saving, which grows with the shard: on one 3,000-document index,
×1.8 the CPU a query for Xapian alone (docs/BENCHMARKS.md "Exact ranking"). The router
searches its local shards as one database (tiers/local_reads.py), which more than pays for it
there; a deployment whose shards are large enough for that price to matter more than a rare
missing hit sets `ranking = "pruned"`, sent to every shard with each search (the contract's
`pruned`).
"""

from __future__ import annotations

import enum

import xapian

from sluice.search.index.analyzer import ID_SLOT
from sluice.search.index.bm25 import ShardWeighting


class Ranking(str, enum.Enum):
    EXACT = "exact"  # every matching document scored (the default)
    PRUNED = "pruned"  # Xapian's early termination: faster on large shards, may drop a hit


def top_mset(
    db: xapian.Database, w: ShardWeighting, query: xapian.Query, top_k: int, pruned: bool = False
) -> xapian.MSet:
    """The top_k of `query` over `db` by BM25 with `w`'s parameters, ties by the id value slot;
    every matching document scored unless `pruned`."""
    enquire = xapian.Enquire(db)
    enquire.set_weighting_scheme(xapian.BM25Weight(w.k1, 0, w.k3, w.b, w.min_normlen))
    enquire.set_sort_by_relevance_then_value(ID_SLOT, False)
    enquire.set_query(query)
    return enquire.get_mset(0, top_k) if pruned else enquire.get_mset(0, top_k, db.get_doccount())
