#!/usr/bin/env python3
"""Search: how often Xapian's pruned matcher gets a top k wrong, and what scoring every match costs.

Corpus: Debian's package descriptions (`--docs`, tests/corpus.py); queries: each package's
one-line summary, as bench/search/search_throughput.py sends them. For each query and each k
of `--ks`, the top k from Xapian left to prune (`Enquire.get_mset(0, k)`, as the library ranks
by default) is compared with Xapian scoring every match (`check_at_least` = the document count,
as sluice ranks by default: src/sluice/search/index/ranking.py) — by the scores listed, so a
tie ordered differently is not counted, only a document missing or one in its place — on one
on-disk index holding every document, and on the same documents split into N shards (hash of
the id) opened as N sub-databases of one Database (the router's union search over its local shards).
Weights: sluice's BM25 parameters, Xapian's default BM25, BM25+ and TF-IDF.

Then the cost, one thread, the two rankings alternating `--repeat` times over the same queries:
queries a second and CPU µs a query of ShardIndex.search on the one index, pruned and exact.

    PYTHONPATH=src .venv/bin/python bench/search/search_pruning.py [--docs 3000] [--queries 1500] [--shards 2,3,4]
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
import tempfile
import time
import zlib
from collections.abc import Callable
from pathlib import Path

import xapian

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the root: tests/corpus.py
from sluice.search.index.analyzer import ID_SLOT
from sluice.search.index.query_builder import build_query
from sluice.search.index.query_tree import Tree, resolve
from sluice.search.index.shard_index import ShardIndex
from tests import corpus

WEIGHTS: dict[str, Callable[[], xapian.Weight]] = {
    "sluice bm25": lambda: xapian.BM25Weight(1.0, 0, 1.0, 0.5, 0.5),
    "xapian bm25": xapian.BM25Weight,
    "bm25+": xapian.BM25PlusWeight,
    "tf-idf": xapian.TfIdfWeight,
}


def scores(db: xapian.Database, tree: Tree, k: int, weight: xapian.Weight, exact: bool) -> list[float]:
    enquire = xapian.Enquire(db)
    enquire.set_weighting_scheme(weight)
    enquire.set_sort_by_relevance_then_value(ID_SLOT, False)
    enquire.set_query(build_query(tree, {}))
    mset = enquire.get_mset(0, k, db.get_doccount()) if exact else enquire.get_mset(0, k)
    return sorted(round(m.weight, 9) for m in mset)


def wrong(db: xapian.Database, trees: list[Tree], ks: list[int], weight: Callable[[], xapian.Weight]) -> int:
    return sum(scores(db, t, k, weight(), False) != scores(db, t, k, weight(), True) for t in trees for k in ks)


def indexed(docs: list[dict], n: int, root: Path) -> list[ShardIndex]:
    """The documents in n on-disk indexes (Xapian's glass, as a replica writes them), placed by
    the hash of their id (one index: every document)."""
    shards = [ShardIndex(root / f"{n}-{i}") for i in range(n)]
    ops = [{"op": "upsert", "id": d["id"], "fields": {k: v for k, v in d.items() if k != "id"}} for d in docs]
    for i, ix in enumerate(shards):
        ix.apply(1, [op for op, d in zip(ops, docs) if n == 1 or zlib.crc32(d["id"].encode()) % n == i])
    return shards


def cost(ix: ShardIndex, queries: list[str], repeat: int) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {"pruned_qps": [], "exact_qps": [], "pruned_cpu_us": [], "exact_cpu_us": []}
    trees = [resolve(q, ix.analyzer) for q in queries]
    for _ in range(repeat):
        for name, pruned in (("pruned", True), ("exact", False)):
            t0, c0 = time.perf_counter(), time.process_time()
            for t in trees:
                ix.search(t, 10, pruned=pruned)
            wall, cpu = time.perf_counter() - t0, time.process_time() - c0
            out[f"{name}_qps"].append(round(len(trees) / wall, 1))
            out[f"{name}_cpu_us"].append(round(cpu / len(trees) * 1e6, 1))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--docs", type=int, default=3000)
    ap.add_argument("--queries", type=int, default=1500)
    ap.add_argument("--ks", default="10,3")
    ap.add_argument("--shards", default="2,3,4")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    docs = corpus.documents(args.docs)
    titles = [t for t in dict.fromkeys(" ".join(re.findall(r"\w+", d["title"])) for d in docs if d.get("title")) if t]
    queries = titles[: args.queries]
    ks = [int(k) for k in args.ks.split(",")]
    root = Path(tempfile.mkdtemp(prefix="sluice-pruning-"))
    one = indexed(docs, 1, root)[0]
    trees = [t for t in (resolve(q, one.analyzer) for q in queries) if t is not None]
    report: dict[str, object] = {"documents": len(docs), "rankings": len(trees) * len(ks)}
    report["one index: wrong top k"] = {name: wrong(one.db, trees, ks, w) for name, w in WEIGHTS.items()}
    for n in [int(s) for s in args.shards.split(",")]:
        union = xapian.Database()
        for ix in indexed(docs, n, root):
            union.add_database(ix.db)
        report[f"{n} sub-databases: wrong top k"] = wrong(union, trees, ks, WEIGHTS["sluice bm25"])
    report["one index, one thread: ShardIndex.search top 10"] = cost(one, queries, args.repeat)
    print(json.dumps(report, indent=1))
    shutil.rmtree(root)


if __name__ == "__main__":
    main()
