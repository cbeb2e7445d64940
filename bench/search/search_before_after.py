#!/usr/bin/env python3
"""Search: an earlier version of the code against this one, side by side in one run.

Two routers — one running the `src/` of an earlier checkout (`git worktree add /tmp/old <commit>`),
one running this tree's — each with --shards local shard replicas, the same corpus and queries,
result cache off, plus the index library alone in this process (the floor the "added p50" is
measured from). Blocks of 25 queries alternate between the three (so load changes hit them
alike), sent by a raw keep-alive socket client, for --passes passes over the same queries:
the first pass meets most terms for the first time (the routers' term-statistics caches are
cold: phase 1 runs), later passes repeat them (warm). Prints, per pass and configuration,
p50/p99, the added p50 over the library, and the CPU time per query of each router and of its
shard processes (from /proc), which a loaded machine distorts much less than latency; and the
load average before and after.

    PYTHONPATH=src .venv/bin/python bench/search/search_before_after.py --before /tmp/old/src \
        [--passes 2] [--json out.json]
"""

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1] / "src"))
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parents[1]))  # the root: tests/corpus.py
from search_latency import RawClient, cpu_s, pct

from sluice.search.index.query_tree import resolve
from sluice.search.index.schema import parse_document
from sluice.search.index.shard_index import ShardIndex
from tests import corpus

BLOCK = 25


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Library:
    """The index library alone, in this process, behind the same post() as a router's client."""

    def __init__(self, docs):
        self.idx = ShardIndex(None)
        for seq, d in enumerate(docs, 1):
            src = parse_document(d)
            self.idx.apply(seq, [{"op": "upsert", "id": src.doc_id, "fields": src.fields}])

    def post(self, path: str, obj: dict) -> dict:
        return {"hits": self.idx.search(resolve(obj["query"], self.idx.analyzer), obj["top_k"])}


def start(tmp: Path, name: str, src: str, shards: int, stats: str) -> tuple[subprocess.Popen, str]:
    cfg = tmp / f"{name}.toml"
    cfg.write_text(
        f'[search]\ncache_entries = 0\nstats = "{stats}"\ndata_dir = "{tmp}/{name}"\n'
        + "".join(f'[[shards]]\nname = "s{i}"\nreplicas = ["local"]\n' for i in range(shards))
    )
    port = free_port()
    env = dict(os.environ, PYTHONPATH=os.path.abspath(src))
    p = subprocess.Popen(
        [sys.executable, "-m", "sluice.cli", "search", "serve", "--port", str(port), "--config", str(cfg)],
        stdout=open(tmp / f"{name}.log", "wb"),
        stderr=subprocess.STDOUT,
        env=env,
    )
    return p, f"http://127.0.0.1:{port}"


Routers = dict[str, tuple[subprocess.Popen, str]]


def load(http: httpx.Client, routers: Routers, docs: list[dict]) -> None:
    """Waits for each router to be ready, then indexes the corpus into it."""
    for _, url in routers.values():
        for _ in range(600):
            try:
                if http.get(url + "/ready").status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        for i in range(0, len(docs), 500):
            body = "\n".join(json.dumps(d) for d in docs[i : i + 500])
            http.post(url + "/v1/search/documents", content=body).raise_for_status()


def measure_pass(
    clients: dict, pids: dict[str, list[int]], routers: Routers, queries: list[str], n_pass: int
) -> dict[str, Any]:
    """One pass over the queries in alternating blocks: latency per client, CPU per router."""
    lat: dict[str, list[float]] = {n: [] for n in clients}
    cpu = {n: [0.0, 0.0] for n in routers}
    for block in range(0, len(queries), BLOCK):
        for n, c in clients.items():
            c0 = [cpu_s(x) for x in pids[n]] if n in pids else None
            for q in queries[block : block + BLOCK]:
                t = time.perf_counter()
                c.post("/v1/search", {"query": q, "top_k": 10})
                lat[n].append(time.perf_counter() - t)
            if c0 is not None:
                c1 = [cpu_s(x) for x in pids[n]]
                cpu[n][0] += c1[0] - c0[0]
                cpu[n][1] += sum(c1[1:]) - sum(c0[1:])
    lib_p50 = pct(lat["library"], 0.5)
    res: dict[str, Any] = {"pass": n_pass + 1, "term_statistics": "cold" if n_pass == 0 else "warm"}
    for n in clients:
        r = {"p50_ms": round(pct(lat[n], 0.5) * 1000, 3), "p99_ms": round(pct(lat[n], 0.99) * 1000, 3)}
        if n in routers:
            r["added_p50_ms"] = round((pct(lat[n], 0.5) - lib_p50) * 1000, 3)
            r["router_cpu_ms_per_query"] = round(cpu[n][0] / len(queries) * 1000, 3)
            r["shards_cpu_ms_per_query"] = round(cpu[n][1] / len(queries) * 1000, 3)
        res[n] = r
    return res


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--before", required=True, help="the src/ folder of the earlier checkout")
    ap.add_argument("--docs", type=int, default=3000)
    ap.add_argument("--queries", type=int, default=300)
    ap.add_argument("--shards", type=int, default=2)
    ap.add_argument("--stats", default="global", choices=["global", "local"])
    ap.add_argument("--passes", type=int, default=2, help="passes over the queries (1st: cold term statistics)")
    ap.add_argument("--json", help="write the results here too")
    args = ap.parse_args()
    docs = corpus.documents(args.docs)
    queries = corpus.queries(docs, args.queries)
    warmup = corpus.queries(docs, 50, seed=99)  # other queries: the measured ones stay unseen
    tmp = Path(tempfile.mkdtemp(prefix="sluice-search-ab-"))
    routers = {
        name: start(tmp, name, src, args.shards, args.stats)
        for name, src in (("before", args.before), ("after", str(HERE.parents[1] / "src")))
    }
    load0 = os.getloadavg()
    try:
        http = httpx.Client(timeout=60)
        load(http, routers, docs)
        clients = {"library": Library(docs), **{n: RawClient(u) for n, (_, u) in routers.items()}}
        pids = {
            n: [p.pid, *http.get(u + "/v1/search/status").json()["local_pids"].values()]
            for n, (p, u) in routers.items()
        }
        for c in clients.values():
            for q in warmup:
                c.post("/v1/search", {"query": q, "top_k": 10})
        passes = []
        for n_pass in range(args.passes):
            res = measure_pass(clients, pids, routers, queries, n_pass)
            passes.append(res)
            print(json.dumps(res), flush=True)
        out: dict[str, Any] = {
            "docs": len(docs),
            "queries": len(queries),
            "shards": args.shards,
            "stats": args.stats,
            "load_average_before": [round(x, 2) for x in load0],
            "passes": passes,
            "load_average_after": [round(x, 2) for x in os.getloadavg()],
        }
        for n, (_, u) in routers.items():  # the statistics cache's and one-round search's counts, where reported
            out[f"{n}_cache"] = http.get(u + "/v1/search/status").json().get("cache")
        print(json.dumps(out, indent=2))
        if args.json:
            Path(args.json).write_text(json.dumps(out, indent=2))
    finally:
        for p, _ in routers.values():
            p.send_signal(signal.SIGTERM)
            p.wait(30)
    return 0


if __name__ == "__main__":
    sys.exit(main())
