"""Retrieval quality of lexical, dense and hybrid search on text nobody here wrote, and the
approximate vector search's recall against exact.

The judged set is Debian's package descriptions (apt's lists; Debian 12 keeps the long
descriptions in the Translation-en lists: `apt-get update -o Acquire::Languages=en` fetches
them): each package's long description is a document (without its one-line summary), and the
summary is the query for it. A hit is relevant when it is that package's document (or another
package's with exactly the same long description: Debian repeats some). Queries are the
summary's words (the query language's operators stripped), the same text for every mode.

Reports recall@10 (the relevant document in the top 10) and MRR@10 for lexical (BM25), dense
(wordllama + exact cosine), hybrid RRF (k = 60) and hybrid weighted (min-max, 0.5), at a few
windows, and the approximate (HNSW) dense search's recall@10 against exact. In one process,
through the shard's own code (ShardIndex) and the router's fusion: the distribution changes
none of these rankings (tests/system/search/test_dense_hybrid.py checks 3 shards against one
index).

    PYTHONPATH=src .venv/bin/python bench/search/search_dense_quality.py --docs 10000 --queries 1000
"""

from __future__ import annotations

import argparse
import random
import re
import sys
import time
from collections.abc import Iterable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the root: tests/corpus.py
from sluice.search.dense.embedder import Embedder
from sluice.search.dense.vectors import encode
from sluice.search.index.hits import Hit, merge
from sluice.search.index.query_tree import resolve
from sluice.search.index.shard_index import ShardIndex
from sluice.search.retrieval import Fusion
from sluice.search.router.query.fusion import fuse
from tests import corpus

K = 10


def judged_set(n_docs: int, n_queries: int, seed: int) -> tuple[list[dict], list[tuple[str, str]]]:
    docs = [d for d in corpus.debian_packages() if d["body"] and d["title"]]
    if len(docs) < 100:
        sys.exit("no Debian long descriptions here: run `apt-get update -o Acquire::Languages=en` first")
    rng = random.Random(seed)
    docs = rng.sample(docs, min(n_docs, len(docs)))
    queries = [(d["id"], " ".join(re.findall(r"\w+", d["title"]))) for d in rng.sample(docs, min(n_queries, len(docs)))]
    return docs, [(i, q) for i, q in queries if q]


def score(rankings: list[list[str]], relevant: list[set[str]]) -> tuple[float, float]:
    recall = mrr = 0.0
    for ranked, rel in zip(rankings, relevant):
        for rank, doc_id in enumerate(ranked[:K], 1):
            if doc_id in rel:
                recall += 1
                mrr += 1 / rank
                break
    return recall / len(rankings), mrr / len(rankings)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--docs", type=int, default=10000)
    ap.add_argument("--queries", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    docs, queries = judged_set(args.docs, args.queries, args.seed)
    by_body: dict[str, set[str]] = {}
    for d in docs:
        by_body.setdefault(d["body"], set()).add(d["id"])
    body_of = {d["id"]: d["body"] for d in docs}
    relevant = [by_body[body_of[i]] for i, _ in queries]

    embedder = Embedder()
    t0 = time.perf_counter()
    vecs = embedder.embed([d["body"] for d in docs])
    embed_s = time.perf_counter() - t0
    index = ShardIndex(None)
    t0 = time.perf_counter()
    index.apply(
        1,
        [
            {"op": "upsert", "id": d["id"], "fields": {"body": d["body"], "section": d["section"]}, "vector": encode(v)}
            for d, v in zip(docs, vecs)
        ],
    )
    index_s = time.perf_counter() - t0
    print(
        f"{len(docs)} documents (embedded in {embed_s:.1f} s, indexed in {index_s:.1f} s), {len(queries)} queries, "
        f"{sum(len(r) > 1 for r in relevant)} with more than one relevant document"
    )

    window = 100
    lexical: list[list[Hit]] = []
    dense: list[list[Hit]] = []
    approx: list[list[Hit]] = []
    timings = {"lexical": 0.0, "dense exact": 0.0, "dense approximate": 0.0}
    for _, q in queries:
        t = time.perf_counter()
        lexical.append(merge([index.search(resolve(q, index.analyzer), window)], window))
        timings["lexical"] += time.perf_counter() - t
        v = embedder.query(q)
        t = time.perf_counter()
        dense.append(index.dense_search(v, window, exact=True))
        timings["dense exact"] += time.perf_counter() - t
        if not approx:
            index.dense_search(v, K, exact=False)  # builds the HNSW graph, not timed
        t = time.perf_counter()
        approx.append(index.dense_search(v, K, exact=False))
        timings["dense approximate"] += time.perf_counter() - t

    rows: list[tuple[str, Iterable[list[str]]]] = [
        ("lexical (BM25)", ([h.doc_id for h in r] for r in lexical)),
        ("dense (exact)", ([h.doc_id for h in r] for r in dense)),
    ]
    for w in (20, 50, 100):
        for fusion, weight in ((Fusion.RRF, 0.5), (Fusion.RRF, 0.3), (Fusion.WEIGHTED, 0.5), (Fusion.WEIGHTED, 0.3)):
            name = f"hybrid {fusion.value}, dense_weight {weight}, window {w}"
            rows.append(
                (
                    name,
                    [[h.doc_id for h in fuse(lx[:w], dn[:w], K, fusion, 60, weight)] for lx, dn in zip(lexical, dense)],
                )
            )
    print(f"\n| mode | recall@{K} | MRR@{K} |\n|---|---|---|")
    for name, rankings in rows:
        r, m = score(list(rankings), relevant)
        print(f"| {name} | {r:.3f} | {m:.3f} |")
    overlap = np.mean(
        [len({h.doc_id for h in a} & {h.doc_id for h in e[:K]}) / max(1, min(K, len(e))) for a, e in zip(approx, dense)]
    )
    print(f"\napproximate (HNSW) dense recall@{K} against exact: {overlap:.4f}")
    for name, s in timings.items():
        print(f"{name}: {s / len(queries) * 1000:.3f} ms a query (top {window if name != 'dense approximate' else K})")


if __name__ == "__main__":
    main()
