#!/usr/bin/env python3
"""Search throughput under concurrency: the router with its local shards against Xapian in one
process, on the same corpus and queries, side by side in one run (issue 43 §4).

--clients threads (default 8), each with one keep-alive connection (search_latency.RawClient),
send the queries as fast as answers come: each query once (distinct queries: the result cache
cannot answer them), split across the clients. "xapian" is the index library alone in this
process: the same clients call ShardIndex.search (one read-only database handle per client) —
no HTTP, no process hop — ranking as Xapian does by default, its matcher left to prune (as the
issue measured it); `--exact-library` also measures it scoring every match, as sluice does by
default (index/ranking.py), reported as `exact_qps`. Then a router (the embedded default's settings: cache on, global
statistics, hedging on, vectors, local_reads: the embedded default's; and with every query over
HTTP to the shard processes, `--modes http`) with 1, 2 and 4 local shards. Reports queries/s, p50/p99 and,
from /proc, the router's and the shards' CPU per query. Corpus: Debian's package descriptions
(`--docs`), queries: their one-line summaries' words; `--snippets N` asks for snippets of N
characters (0: none, the library's plain search) and makes the library compute them too.

With local reads the router's CPU per query is also split: the shards' index work (the status
JSON's `local_reads.index_cpu_s`, its thread's CPU time around each local answer) and the
router's own (the rest). `--before SRC` runs another tree's router too, just before this one's
(just after it in even repeats), each after the library alone; `--repeat N` the whole sequence
N times; `--profile DIR` runs
each router under cProfile timed by CPU. `--interleave` (with `--before`, local reads): both
routers up at once and every query sent to both, so that the two trees' CPU per query is
measured over the same moments of a machine whose speed drifts (CPU figures only).

    PYTHONPATH=src .venv/bin/python bench/search/search_throughput.py [--docs 3000] [--queries 2000] [--shards 1,2,4]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
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


def library(
    docs: list[dict], queries: list[str], n_clients: int, snippets: int, tmp: Path, exact: bool = False
) -> dict:
    """Xapian alone, as the issue measured it: its matcher left to prune (`exact`: every match
    scored, as sluice ranks by default; index/ranking.py)."""
    path = tmp / "library"
    if path.exists():
        import shutil

        shutil.rmtree(path)
    ix = ShardIndex(path)
    ix.apply(1, [{"op": "upsert", "id": d["id"], "fields": {k: v for k, v in d.items() if k != "id"}} for d in docs])
    ix.close()
    handles = [ShardIndex.read_only(xapian.Database(str(path))) for _ in range(n_clients)]

    def client(h: ShardIndex) -> Callable[[str], object]:
        return lambda q: h.search(resolve(q, h.analyzer), 10, snippet_chars=snippets, pruned=not exact)

    for q in queries[:200]:
        client(handles[0])(q)
    lat, wall = load([client(h) for h in handles], queries, {})
    return {
        "qps": round(len(queries) / wall, 1),
        "p50_ms": round(pct(lat, 0.5) * 1000, 3),
        "p99_ms": round(pct(lat, 0.99) * 1000, 3),
    }


def index_cpu_s(status: dict) -> float | None:
    """The CPU the router's local reads spent in the shards' index work so far (status JSON)."""
    return status.get("local_reads", {}).get("index_cpu_s")


@contextlib.contextmanager
def started_router(
    docs: list[dict], shards: int, tmp: Path, local_reads: bool, src: str | None = None, tag: str = ""
) -> Iterator[tuple[subprocess.Popen, str, list[int]]]:
    """A router (`sluice search serve`, the embedded default's settings) with `shards` local
    shards holding `docs`: (its process, its URL, its shard processes' pids); stopped after.
    `src`: the router runs from that source tree (--before) instead of this one."""
    name = f"r{shards}{'-local' if local_reads else ''}{'-before' if src else ''}{tag}"
    cfg = tmp / f"{name}.toml"
    cfg.write_text(
        f'[search]\ndata_dir = "{tmp / name}"\nlocal_reads = {str(local_reads).lower()}\n'
        + "".join(f'[[shards]]\nname = "s{i}"\n' for i in range(shards))
    )
    port = search_latency.free_port()
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
        yield p, url, shard_pids
    finally:
        # uvicorn re-raises the signal it stopped on: SIGINT's KeyboardInterrupt lets cProfile write
        p.send_signal(signal.SIGINT) if PROFILE else p.terminate()
        p.wait(30)


def asker(c: RawClient, snippets: int, partial: list[int]) -> Callable[[str], None]:
    def ask(q: str) -> None:
        partial[0] += c.post("/v1/search", {"query": q, "top_k": 10, "snippet_chars": snippets})["partial"]

    return ask


def warm(url: str, warmup: list[str], n_clients: int, snippets: int) -> list[RawClient]:
    """n_clients connections, the warm-up queries sent across them."""
    conns = [RawClient(url) for _ in range(n_clients)]
    for i, q in enumerate(warmup):
        conns[i % n_clients].post("/v1/search", {"query": q, "top_k": 10, "snippet_chars": snippets})
    return conns


def status_of(url: str) -> dict:
    with httpx.Client(timeout=30) as http:
        return http.get(url + "/v1/search/status").json()


def cpu_split(pid: int, index_cpu: float | None) -> dict:
    """A router's CPU seconds so far: its process's from /proc, the kernel's part of it (its
    system calls and the loopback TCP they drive), and (with local reads) the shards' index
    work inside it — the router's own count of its thread's CPU time around each local answer,
    None from a tree before it was counted. per_query() turns two of them into figures."""
    return {"cpu": cpu_s(pid), "kernel": cpu_s(pid, kernel_only=True), "index": index_cpu}


def per_query(a: dict, b: dict, queries: int) -> dict:
    """CPU ms per query between two cpu_split()s; the router's own = its total − index work."""
    ms = 1000 / queries
    index = None if a["index"] is None or b["index"] is None else (b["index"] - a["index"]) * ms
    total = (b["cpu"] - a["cpu"]) * ms
    return {
        "router_cpu_ms_per_query": round(total, 3),
        "router_index_cpu_ms_per_query": None if index is None else round(index, 3),
        "router_own_cpu_ms_per_query": None if index is None else round(total - index, 3),
        "router_kernel_cpu_ms_per_query": round((b["kernel"] - a["kernel"]) * ms, 3),
    }


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
    with started_router(docs, shards, tmp, local_reads, src) as (p, url, shard_pids):
        conns = warm(url, warmup, n_clients, snippets)
        partial = [0]
        cpu0 = cpu_split(p.pid, index_cpu_s(status_of(url)))
        shards0 = sum(cpu_s(s) for s in shard_pids)
        lat, wall = load([asker(c, snippets, partial) for c in conns], queries, {})
        shards1 = sum(cpu_s(s) for s in shard_pids)
        st = status_of(url)
        cpu1 = cpu_split(p.pid, index_cpu_s(st))
        rounds = {**st["cache"]["one_round"], **({"local_reads": st["local_reads"]} if "local_reads" in st else {})}
        for c in conns:
            c.close()
        return {
            "qps": round(len(queries) / wall, 1),
            "p50_ms": round(pct(lat, 0.5) * 1000, 3),
            "p99_ms": round(pct(lat, 0.99) * 1000, 3),
            "partial": partial[0],
            **per_query(cpu0, cpu1, len(queries)),
            "shards_cpu_ms_per_query": round((shards1 - shards0) / len(queries) * 1000, 3),
            "one_round": rounds,
        }


def interleaved(
    docs: list[dict], queries: list[str], warmup: list[str], shards: int, n_clients: int, tmp: Path, before: str
) -> dict:
    """--interleave: both routers up at once, each client sending every one of its queries to
    both (which first alternates), so that the two measure under the same machine at the same
    moments — on a shared machine whose speed drifts by 30 % between runs a minute apart, the
    sequential runs' CPU per query differed more between runs than between trees."""
    with (
        started_router(docs, shards, tmp, True, before, "-a") as (pa, ua, _),
        started_router(docs, shards, tmp, True, None, "-b") as (pb, ub, _),
    ):
        ca, cb = warm(ua, warmup, n_clients, 0), warm(ub, warmup, n_clients, 0)
        partial = [0]
        clients = []
        for a, b in zip(ca, cb):
            ask_a, ask_b = asker(a, 0, partial), asker(b, 0, partial)

            def both(q: str, ask_a=ask_a, ask_b=ask_b) -> None:
                first, second = (ask_a, ask_b) if hash(q) % 2 else (ask_b, ask_a)
                first(q)
                second(q)

            clients.append(both)
        s0 = {p.pid: cpu_split(p.pid, index_cpu_s(status_of(u))) for p, u in ((pa, ua), (pb, ub))}
        load(clients, queries, {})
        s1 = {p.pid: cpu_split(p.pid, index_cpu_s(status_of(u))) for p, u in ((pa, ua), (pb, ub))}
        for c in ca + cb:
            c.close()
        was, now = (per_query(s0[p.pid], s1[p.pid], len(queries)) for p in (pa, pb))
        own_a, own_b = was["router_own_cpu_ms_per_query"], now["router_own_cpu_ms_per_query"]
        return {
            "before": was,
            "after": now,
            "partial": partial[0],
            "own_after_over_before": None if not own_a or own_b is None else round(own_b / own_a, 3),
            "load_average": os.getloadavg()[0],
        }


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--docs", type=int, default=3000)
    ap.add_argument("--queries", type=int, default=2000)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--shards", default="1,2,4")
    ap.add_argument("--snippets", type=int, default=0)
    ap.add_argument("--json", default=None)
    ap.add_argument(
        "--exact-library", action="store_true", help="also measure Xapian alone scoring every match (exact_qps)"
    )
    ap.add_argument(
        "--modes",
        default="local,http",
        help="local: local_reads (the embedded default); http: every query to the shard processes over HTTP",
    )
    ap.add_argument("--before", default=None, help="another tree's src/: its router too, side by side")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument(
        "--interleave",
        action="store_true",
        help="with --before: both routers (local reads) up at once, each query sent to both; CPU per query only",
    )
    ap.add_argument("--profile", default="", help="run each router under cProfile, writing NAME.prof into this folder")
    args = ap.parse_args()
    if args.interleave and not args.before:
        ap.error("--interleave compares two trees: give --before SRC")
    global PROFILE
    PROFILE = args.profile
    docs = corpus.documents(args.docs)
    titles = list(dict.fromkeys(" ".join(re.findall(r"\w+", d["title"])) for d in docs if d.get("title")))
    titles = [t for t in titles if t]
    warmup, queries = titles[:200], titles[200 : 200 + args.queries]
    print(f"{len(docs)} documents, {len(queries)} distinct queries, {args.clients} clients, snippets {args.snippets}")
    out = {}
    # --before SRC: each configuration runs twice, the other tree's router first (second in even
    # repeats), each just after the library alone; --repeat N: the whole sequence N times
    trees = [("before", args.before), ("after", None)] if args.before else [("", None)]
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        for rep in range(1, args.repeat + 1):
            if args.interleave:
                for shards in [int(s) for s in args.shards.split(",")]:
                    label = f"{shards} shards, local, interleaved, run {rep}"
                    out[label] = interleaved(docs, queries, warmup, shards, args.clients, tmp, args.before)
                    print(f"{label}: {out[label]}", flush=True)
                continue
            for shards in [int(s) for s in args.shards.split(",")]:
                for mode in args.modes.split(","):
                    # the order alternates between repeats: the second router of a pair measured
                    # slower than the first on this machine whichever tree it was (docs/BENCHMARKS.md)
                    for tree, src in trees if rep % 2 else trees[::-1]:
                        lib = library(docs, queries, args.clients, args.snippets, tmp)  # the library just before
                        if args.exact_library:
                            exact = library(docs, queries, args.clients, args.snippets, tmp, exact=True)
                            lib["exact_qps"] = exact["qps"]
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
