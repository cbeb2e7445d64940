#!/usr/bin/env python3
"""Search throughput under concurrency: the router with its local shards against Xapian in one
process, on the same corpus and queries, side by side in one run (issue 43 §4).

--clients threads (default 8), each with one keep-alive connection (search_latency.RawClient),
send the queries as fast as answers come: each query once (distinct queries: the result cache
cannot answer them), split across the clients. "xapian" is the index library alone in this
process: the same clients call ShardIndex.search (one read-only database handle per client) —
no HTTP, no process hop. Then a router (the embedded default's settings: cache on, global
statistics, hedging on, vectors, local_reads: the embedded default's; and with every query over
HTTP to the shard processes, `--modes http`) with 1, 2 and 4 local shards. Reports queries/s, p50/p99 and,
from /proc, the router's and the shards' CPU per query. Corpus: Debian's package descriptions
(`--docs`), queries: their one-line summaries' words; `--snippets N` asks for snippets of N
characters (0: none, the library's plain search) and makes the library compute them too.

With local reads the router's CPU per query is also split: the shards' index work (the status
JSON's `local_reads.index_cpu_s`, its thread's CPU time around each local answer) and the
router's own (the rest). `--before SRC` runs another tree's router too, just before this one's,
each after the library alone; `--repeat N` the whole sequence N times; `--profile DIR` runs
each router under cProfile timed by CPU.

    PYTHONPATH=src .venv/bin/python bench/search/search_throughput.py [--docs 3000] [--queries 2000] [--shards 1,2,4]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import xapian

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1] / "src"))
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parents[1]))  # the root: tests/corpus.py
import search_latency
from search_latency import RawClient, cpu_s, ingest, pct

from bench.common import answers_200
from sluice.search.index.query_tree import resolve
from sluice.search.index.shard_index import ShardIndex
from tests import corpus

PROFILE = ""  # --profile DIR: each router runs under cProfile, its profile written there
PROFILED = """import cProfile, time
from sluice.cli import main
p = cProfile.Profile(time.process_time)
try:
    p.runcall(main, %r)
except (KeyboardInterrupt, SystemExit):
    pass
finally:
    p.dump_stats(%r)
"""


def load(clients: list, queries: list[str], body: dict) -> tuple[list[float], float]:
    """Every query once, split across the clients (each a thread), as fast as they answer."""
    lat: list[float] = []
    lock = threading.Lock()

    def run(client, part: list[str]) -> None:
        mine = []
        for q in part:
            t = time.perf_counter()
            client(q)
            mine.append(time.perf_counter() - t)
        with lock:
            lat.extend(mine)

    threads = [threading.Thread(target=run, args=(c, queries[i :: len(clients)])) for i, c in enumerate(clients)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return lat, time.perf_counter() - t0


def library(docs: list[dict], queries: list[str], n_clients: int, snippets: int, tmp: Path) -> dict:
    path = tmp / "library"
    if path.exists():
        import shutil

        shutil.rmtree(path)
    ix = ShardIndex(path)
    ix.apply(1, [{"op": "upsert", "id": d["id"], "fields": {k: v for k, v in d.items() if k != "id"}} for d in docs])
    ix.close()
    handles = [ShardIndex.read_only(xapian.Database(str(path))) for _ in range(n_clients)]

    def client(h: ShardIndex):
        return lambda q: h.search(resolve(q, h.analyzer), 10, snippet_chars=snippets)

    for q in queries[:200]:
        handles[0].search(resolve(q, handles[0].analyzer), 10)
    lat, wall = load([client(h) for h in handles], queries, {})
    return {
        "qps": round(len(queries) / wall, 1),
        "p50_ms": round(pct(lat, 0.5) * 1000, 3),
        "p99_ms": round(pct(lat, 0.99) * 1000, 3),
    }


def index_cpu_s(status: dict) -> float | None:
    """The CPU the router's local reads spent in the shards' index work so far (status JSON)."""
    return status.get("local_reads", {}).get("index_cpu_s")


def router(
    docs: list[dict],
    queries: list[str],
    warmup: list[str],
    shards: int,
    n_clients: int,
    snippets: int,
    tmp: Path,
    local_reads: bool,
    src: str | None = None,
) -> dict:
    """`src`: the router runs from that source tree (--before) instead of this one."""
    name = f"r{shards}{'-local' if local_reads else ''}{'-before' if src else ''}"
    cfg = tmp / f"{name}.toml"
    cfg.write_text(
        f'[search]\ndata_dir = "{tmp / name}"\nlocal_reads = {str(local_reads).lower()}\n'
        + "".join(f'[[shards]]\nname = "s{i}"\n' for i in range(shards))
    )
    port = search_latency.free_port()
    import subprocess

    log = open(tmp / f"{name}.log", "wb")
    serve = ["search", "serve", "--port", str(port), "--config", str(cfg)]
    # --profile: the router under cProfile timed by its CPU (process_time), not the wall clock
    # that other processes on a busy machine would inflate
    prof = PROFILED % (serve, f"{PROFILE}/{name}.prof")
    p = subprocess.Popen(
        [sys.executable, *(["-c", prof] if PROFILE else ["-m", "sluice.cli", *serve])],
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, "PYTHONPATH": src} if src else None,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        if not answers_200(url + "/ready"):
            raise RuntimeError((tmp / f"{name}.log").read_text()[-2000:])
        with httpx.Client(timeout=120) as http:
            ingest(http, url, docs)
            shard_pids = list(http.get(url + "/v1/search/status").json()["local_pids"].values())
        conns = [RawClient(url) for _ in range(n_clients)]
        for i, q in enumerate(warmup):
            conns[i % n_clients].post("/v1/search", {"query": q, "top_k": 10, "snippet_chars": snippets})
        partial = [0]

        def client(c: RawClient):
            def ask(q: str) -> None:
                partial[0] += c.post("/v1/search", {"query": q, "top_k": 10, "snippet_chars": snippets})["partial"]

            return ask

        with httpx.Client(timeout=30) as http:
            index0 = index_cpu_s(http.get(url + "/v1/search/status").json())
        cpu0 = cpu_s(p.pid), sum(cpu_s(s) for s in shard_pids), cpu_s(p.pid, kernel_only=True)
        lat, wall = load([client(c) for c in conns], queries, {})
        cpu1 = cpu_s(p.pid), sum(cpu_s(s) for s in shard_pids), cpu_s(p.pid, kernel_only=True)
        with httpx.Client(timeout=30) as http:
            st = http.get(url + "/v1/search/status").json()
            rounds = {**st["cache"]["one_round"], **({"local_reads": st["local_reads"]} if "local_reads" in st else {})}
        index1 = index_cpu_s(st)
        for c in conns:
            c.close()
        router_cpu = (cpu1[0] - cpu0[0]) / len(queries) * 1000
        # (b) the local reads' index work, from the router's own count of its thread's CPU time
        # around each answer (absent from a tree before it was counted); (c) = (a) - (b)
        index_cpu = None if index0 is None or index1 is None else (index1 - index0) / len(queries) * 1000
        return {
            "qps": round(len(queries) / wall, 1),
            "p50_ms": round(pct(lat, 0.5) * 1000, 3),
            "p99_ms": round(pct(lat, 0.99) * 1000, 3),
            "partial": partial[0],
            "router_cpu_ms_per_query": round(router_cpu, 3),
            "router_index_cpu_ms_per_query": None if index_cpu is None else round(index_cpu, 3),
            "router_own_cpu_ms_per_query": None if index_cpu is None else round(router_cpu - index_cpu, 3),
            # of the router's CPU, the kernel's: its system calls and the loopback TCP they drive
            "router_kernel_cpu_ms_per_query": round((cpu1[2] - cpu0[2]) / len(queries) * 1000, 3),
            "shards_cpu_ms_per_query": round((cpu1[1] - cpu0[1]) / len(queries) * 1000, 3),
            "one_round": rounds,
        }
    finally:
        # uvicorn re-raises the signal it stopped on: SIGINT's KeyboardInterrupt lets cProfile write
        p.send_signal(signal.SIGINT) if PROFILE else p.terminate()
        p.wait(30)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--docs", type=int, default=3000)
    ap.add_argument("--queries", type=int, default=2000)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--shards", default="1,2,4")
    ap.add_argument("--snippets", type=int, default=0)
    ap.add_argument("--json", default=None)
    ap.add_argument(
        "--modes",
        default="local,http",
        help="local: local_reads (the embedded default); http: every query to the shard processes over HTTP",
    )
    ap.add_argument("--before", default=None, help="another tree's src/: its router too, side by side")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--profile", default="", help="run each router under cProfile, writing NAME.prof into this folder")
    args = ap.parse_args()
    global PROFILE
    PROFILE = args.profile
    docs = corpus.documents(args.docs)
    titles = list(dict.fromkeys(" ".join(re.findall(r"\w+", d["title"])) for d in docs if d.get("title")))
    titles = [t for t in titles if t]
    warmup, queries = titles[:200], titles[200 : 200 + args.queries]
    print(f"{len(docs)} documents, {len(queries)} distinct queries, {args.clients} clients, snippets {args.snippets}")
    out = {}
    # --before SRC: each configuration runs twice, the other tree's router first, each just after
    # the library alone; --repeat N: the whole sequence N times (ratios side by side)
    trees = [("before", args.before), ("after", None)] if args.before else [("", None)]
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        for rep in range(1, args.repeat + 1):
            for shards in [int(s) for s in args.shards.split(",")]:
                for mode in args.modes.split(","):
                    for tree, src in trees:
                        lib = library(docs, queries, args.clients, args.snippets, tmp)  # the library just before
                        local = mode == "local"
                        got = router(docs, queries, warmup, shards, args.clients, args.snippets, tmp, local, src)
                        got["ratio_to_xapian"] = round(got["qps"] / lib["qps"], 3)
                        got["load_average"] = os.getloadavg()[0]
                        label = f"{shards} shards, {mode}{', ' + tree if tree else ''}, run {rep}"
                        out[f"xapian (before {label})"] = lib
                        out[f"router, {label}"] = got
                        print(f"xapian alone: {lib}\nrouter, {label}: {got}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
