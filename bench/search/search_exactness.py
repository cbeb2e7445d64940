#!/usr/bin/env python3
"""Search: how far merged shard results are from one index, per statistics mode (docs/SEARCH.md).

In this process, the index library alone: one Xapian database with every document (the
reference) and N shards of the same documents (hash, and content-skewed: one section family on
shard 0). For each query, the merged top-10 of the shards is compared with the reference's:
- `global` (the router's default: phase 1 sums every shard's statistics): identical top-10 ids
  (in order) and the largest relative score difference;
- `local` (`stats = "local"`: each shard scores with its own statistics): identical top-10
  fraction and the mean overlap of the top-10 sets.

    PYTHONPATH=src .venv/bin/python bench/search/search_exactness.py [--docs 5000] [--queries 300] [--shards 4]
"""

from __future__ import annotations

import argparse
import json
import sys
import zlib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the root: tests/corpus.py

from sluice.search.index.bm25 import CollectionStats
from sluice.search.index.hits import merge
from sluice.search.index.query_tree import resolve, terms_of
from sluice.search.index.schema import parse_document
from sluice.search.index.shard_index import ShardIndex
from tests import corpus


def build(docs, n, place):
    shards = [ShardIndex(None) for _ in range(n)]
    for seq, d in enumerate(docs, 1):
        src = parse_document(d)
        shards[place(d, n)].apply(seq, [{"op": "upsert", "id": src.doc_id, "fields": src.fields}])
    return shards


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--docs", type=int, default=5000)
    ap.add_argument("--queries", type=int, default=300)
    ap.add_argument("--shards", type=int, default=4)
    args = ap.parse_args()
    docs = corpus.documents(args.docs)
    queries = corpus.queries(docs, args.queries)
    one = build(docs, 1, lambda d, n: 0)[0]
    sections = sorted({d["section"] for d in docs}, key=lambda s: -sum(d["section"] == s for d in docs))
    placements = {
        "hash": lambda d, n: zlib.crc32(d["id"].encode()) % n,
        "content": lambda d, n: 0 if d["section"] == sections[0] else 1 + zlib.crc32(d["id"].encode()) % (n - 1),
    }
    out = {}
    for name, place in placements.items():
        shards = build(docs, args.shards, place)
        same_g = same_l = 0
        overlap = 0.0
        max_rel = 0.0
        for q in queries:
            tree = resolve(q, one.analyzer)
            want = one.search(tree, 10)
            glob = CollectionStats()
            for s in shards:
                glob.add(s.stats(terms_of(tree)))
            got_g = merge([s.search(tree, 10, glob) for s in shards], 10)
            got_l = merge([s.search(tree, 10) for s in shards], 10)
            ids = [h.doc_id for h in want]
            same_g += [h.doc_id for h in got_g] == ids
            same_l += [h.doc_id for h in got_l] == ids
            overlap += len(set(ids) & {h.doc_id for h in got_l}) / len(ids) if ids else 1.0
            for g, w in zip(got_g, want):
                max_rel = max(max_rel, abs(g.score - w.score) / abs(w.score) if w.score else abs(g.score))
        n = len(queries)
        out[name] = {
            "shard_sizes": [s.doc_count() for s in shards],
            "global": {"identical_top10": f"{same_g}/{n}", "max_rel_score_diff": max_rel},
            "local": {"identical_top10": f"{same_l}/{n}", "mean_top10_overlap": round(overlap / n, 4)},
        }
    print(json.dumps({"docs": len(docs), "queries": len(queries), "shards": args.shards, **out}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
