#!/usr/bin/env python3
"""Search: the cyclic garbage collector's share of the router's CPU per query, in one process.

A router as `sluice search serve` builds it (RouterRuntime: the result cache on, global
statistics, local reads) over 2 shards (`--shards N`) whose indexes a Replica wrote in this process; every
query is decoded through the contract, searched and written as the answer's JSON, without
sockets. Queries (top_k 10, no snippets unless --snippets N): Debian's one-line package
summaries (as bench/search/search_throughput.py), each once, so the result cache holds every
answer and hits none. Reported per query: the
process's CPU, the shards' index work inside it (local_reads' count), the router's own (the
rest), the collector's time (gc.callbacks around each collection, thread CPU time), the
collections by generation, the objects they freed (cyclic garbage), and what the collector
still tracks at the end (the objects a full collection would walk).

Works on an earlier tree too (RouterRuntime, Replica and SearchRequest as they were), so two
trees compare side by side:

    PYTHONPATH=src .venv/bin/python bench/search/search_gc.py
    PYTHONPATH=/tmp/before/src .venv/bin/python bench/search/search_gc.py
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the root: tests/corpus.py
from sluice.search.contract import SearchRequest
from tests import corpus
from tests.local_search_router import local_router


class CollectorClock:
    """The collector's CPU time and work, from gc.callbacks."""

    def __init__(self) -> None:
        self.seconds, self.collections, self.freed, self._t0 = 0.0, [0, 0, 0], 0, 0.0
        gc.callbacks.append(self._callback)

    def _callback(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._t0 = time.thread_time()
            return
        self.seconds += time.thread_time() - self._t0
        self.collections[info["generation"]] += 1
        self.freed += info["collected"]


async def run(args: argparse.Namespace) -> dict:
    docs = corpus.documents(args.docs)
    titles = [t for t in dict.fromkeys(" ".join(re.findall(r"\w+", d["title"])) for d in docs if d.get("title")) if t]
    warmup, queries = titles[:200], titles[200 : 200 + args.queries]
    rt = local_router(docs, Path(tempfile.mkdtemp(prefix="sluice-search-gc-")), args.shards)
    max_top_k, ranges = rt.cfg.search.max_top_k, rt.schema.ranges
    ask = {"top_k": 10, "snippet_chars": args.snippets}
    bodies = [json.dumps({"query": q, **ask}).encode() for q in queries]
    for q in warmup:
        body = json.dumps({"query": q, **ask}).encode()
        (await rt.search(SearchRequest.decode(body, max_top_k, ranges))).json_bytes()
    gc.collect()
    gc.freeze()  # as the router does when ready (search/router/main.py)
    clock = CollectorClock()
    local = rt.local_reads
    assert local is not None
    index0, t0 = local.index_cpu_ns, time.process_time()
    for body in bodies:
        (await rt.search(SearchRequest.decode(body, max_top_k, ranges))).json_bytes()
    total = time.process_time() - t0
    index = (local.index_cpu_ns - index0) / 1e9
    n = len(bodies)
    return {
        "queries": n,
        "cpu_us_per_query": round(total / n * 1e6, 1),
        "index_us_per_query": round(index / n * 1e6, 1),
        "own_us_per_query": round((total - index) / n * 1e6, 1),
        "gc_us_per_query": round(clock.seconds / n * 1e6, 2),
        "collections": clock.collections,
        "cyclic_garbage_per_query": round(clock.freed / n, 2),
        "tracked_after": len(gc.get_objects()),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--docs", type=int, default=3000)
    ap.add_argument("--queries", type=int, default=2400)
    ap.add_argument("--shards", type=int, default=2)
    ap.add_argument("--snippets", type=int, default=0, help="snippet_chars asked (0: none, as search_throughput.py)")
    args = ap.parse_args()
    print(json.dumps(asyncio.run(run(args))))


if __name__ == "__main__":
    main()
