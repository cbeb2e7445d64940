#!/usr/bin/env python3
"""Search: the cost of the distributed layer, side by side in one run (docs/BENCHMARKS.md).

Same corpus (Debian package descriptions, topped up by the Zipfian generator) and the same
queries for every configuration; queries are sent one at a time (latency, not saturation),
the result cache is off, and every router's shards are local replica processes:

- `library`: the index library alone in this process (ShardIndex.search: Xapian + our query
  tree) — the floor;
- `N shards`: `sluice search serve` with N local shards, global statistics (two phases);
- `2 shards, local stats`: one phase, per-shard statistics (what phase 1 costs);
- `2×2 hedge on/off`: 2 shards × 2 replicas, hedging after the shard's p95 or not (p99).
Also: ingest documents/s through the router (bulk of 500, fsync'd write log).

    PYTHONPATH=src .venv/bin/python bench/search_latency.py [--docs 4000] [--queries 300] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

from sluice.search import corpus  # noqa: E402
from sluice.search.index.query_tree import resolve  # noqa: E402
from sluice.search.index.schema import parse_document  # noqa: E402
from sluice.search.index.shard_index import ShardIndex  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


def summary(lat_s: list[float], wall_s: float) -> dict:
    return {"p50_ms": round(pct(lat_s, 0.5) * 1000, 3), "p99_ms": round(pct(lat_s, 0.99) * 1000, 3),
            "mean_ms": round(statistics.fmean(lat_s) * 1000, 3), "qps": round(len(lat_s) / wall_s, 1)}


def library(docs, queries) -> dict:
    idx = ShardIndex(None)
    for seq, d in enumerate(docs, 1):
        src = parse_document(d)
        idx.apply(seq, [{"op": "upsert", "id": src.doc_id, "fields": src.fields}])
    for q in queries[:50]:
        idx.search(resolve(q, idx.analyzer), 10)
    lat = []
    t0 = time.perf_counter()
    for q in queries:
        s = time.perf_counter()
        idx.search(resolve(q, idx.analyzer), 10)
        lat.append(time.perf_counter() - s)
    return summary(lat, time.perf_counter() - t0)


def router(tmp: Path, name: str, shards: int, replicas: int = 1, stats: str = "global", hedge: bool = True):
    cfg = tmp / f"{name}.toml"
    reps = ", ".join(['"local"'] * replicas)
    cfg.write_text(f'[search]\ncache_entries = 0\nstats = "{stats}"\nhedge = {str(hedge).lower()}\n'
                   f'data_dir = "{tmp / name}"\n'
                   + "".join(f'[[shards]]\nname = "s{i}"\nreplicas = [{reps}]\n' for i in range(shards)))
    port = free_port()
    log = open(tmp / f"{name}.log", "wb")
    p = subprocess.Popen([sys.executable, "-m", "sluice.cli", "search", "serve", "--port", str(port),
                          "--config", str(cfg)], stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/ready", timeout=2).status_code == 200:
                return p, url
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    p.kill()
    raise RuntimeError(f"router {name} not ready: {(tmp / f'{name}.log').read_text()[-2000:]}")


def ingest(http: httpx.Client, url: str, docs) -> float:
    t0 = time.perf_counter()
    for i in range(0, len(docs), 500):
        body = "\n".join(json.dumps(d) for d in docs[i:i + 500])
        r = http.post(url + "/v1/search/documents", content=body)
        r.raise_for_status()
    return len(docs) / (time.perf_counter() - t0)


def measure(http: httpx.Client, url: str, queries) -> dict:
    for q in queries[:50]:
        http.post(url + "/v1/search", json={"query": q, "top_k": 10})
    lat = []
    partial = 0
    t0 = time.perf_counter()
    for q in queries:
        s = time.perf_counter()
        r = http.post(url + "/v1/search", json={"query": q, "top_k": 10})
        lat.append(time.perf_counter() - s)
        partial += r.json()["partial"]
    out = summary(lat, time.perf_counter() - t0)
    out["partial"] = partial
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--docs", type=int, default=4000)
    ap.add_argument("--queries", type=int, default=300)
    ap.add_argument("--json", help="write the results here too")
    args = ap.parse_args()
    docs = corpus.documents(args.docs)
    queries = corpus.queries(docs, args.queries)
    results: dict = {"docs": len(docs), "queries": len(queries), "library": library(docs, queries)}
    print(f"library alone: {results['library']}", flush=True)
    runs = [("1 shard", 1, 1, "global", True), ("2 shards", 2, 1, "global", True), ("4 shards", 4, 1, "global", True),
            ("2 shards, local stats", 2, 1, "local", True), ("2x2 hedge off", 2, 2, "global", False),
            ("2x2 hedge on", 2, 2, "global", True)]
    with tempfile.TemporaryDirectory(prefix="sluice-search-bench-") as d, httpx.Client(timeout=60, transport=httpx.HTTPTransport(
            socket_options=[(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)])) as http:
        for name, shards, reps, stats, hedge in runs:
            p, url = router(Path(d), name.replace(" ", "_").replace(",", ""), shards, reps, stats, hedge)
            try:
                rate = ingest(http, url, docs)
                res = measure(http, url, queries)
                res["ingest_docs_per_s"] = round(rate)
                res["added_p50_ms"] = round(res["p50_ms"] - results["library"]["p50_ms"], 3)
                results[name] = res
                print(f"{name}: {res}", flush=True)
            finally:
                p.send_signal(signal.SIGTERM)
                p.wait(30)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
