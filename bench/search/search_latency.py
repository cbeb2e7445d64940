#!/usr/bin/env python3
"""Search: the cost of the distributed layer, side by side in one run (docs/BENCHMARKS.md).

Same corpus (Debian package descriptions, topped up by the Zipfian generator) and the same
queries for every configuration; queries are sent one at a time (latency, not saturation),
the result cache is off, and every router's shards are local replica processes:

- `library`: the index library alone in this process (ShardIndex.search: Xapian + our query
  tree) — the floor;
- `N shards`: `sluice search serve` with N local shards, global statistics: measured twice over
  the same queries — first with the router's term-statistics cache cold (most terms are new:
  phase 1 runs), then warm (`warm_*`: every term known, one round trip); one shard needs no
  phase 1 at all;
- `2 shards, local stats`: one phase, per-shard statistics (what phase 1 costs);
- `2×2 hedge on/off`: 2 shards × 2 replicas, hedging after the shard's p95 or not (p99).
Also: ingest documents/s through the router (bulk of 500, fsync'd write log), and the CPU time
each configuration's processes spent per query (router, and the shard replicas together, from
/proc): on a shared, loaded machine wall-clock latency is mostly scheduling delay, CPU time much
less so; and the load average before and after. Queries are sent by a raw keep-alive socket
client, so the figures are the service's cost, not a Python HTTP client's (httpx's own sync client
costs ~1 ms a request here).

    PYTHONPATH=src .venv/bin/python bench/search/search_latency.py [--docs 4000] [--queries 300] [--json out.json]
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

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the root: tests/corpus.py

from bench.common import answers_200
from sluice.search.index.query_tree import resolve
from sluice.search.index.schema import parse_document
from sluice.search.index.shard_index import ShardIndex
from tests import corpus


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


def summary(lat_s: list[float], wall_s: float) -> dict:
    return {
        "p50_ms": round(pct(lat_s, 0.5) * 1000, 3),
        "p99_ms": round(pct(lat_s, 0.99) * 1000, 3),
        "mean_ms": round(statistics.fmean(lat_s) * 1000, 3),
        "qps": round(len(lat_s) / wall_s, 1),
    }


def library(docs, queries) -> dict:
    idx = ShardIndex(None)
    for seq, d in enumerate(docs, 1):
        src = parse_document(d)
        idx.apply(seq, [{"op": "upsert", "id": src.doc_id, "fields": src.fields}])
    for q in queries[:50]:
        idx.search(resolve(q, idx.analyzer), 10)
    lat = []
    t0 = time.perf_counter()
    c0 = time.process_time()
    for q in queries:
        s = time.perf_counter()
        idx.search(resolve(q, idx.analyzer), 10)
        lat.append(time.perf_counter() - s)
    out = summary(lat, time.perf_counter() - t0)
    out["cpu_ms_per_query"] = round((time.process_time() - c0) / len(queries) * 1000, 3)
    return out


def cpu_s(pid: int, kernel_only: bool = False) -> float:
    """A process's CPU seconds (user + kernel; `kernel_only`: the kernel's part, its system calls
    and the loopback TCP work they do), from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = int(fields[12]) if kernel_only else int(fields[11]) + int(fields[12])
    return ticks / os.sysconf("SC_CLK_TCK")


class RawClient:
    """One keep-alive HTTP/1.1 connection, JSON POSTs only (content-length answers)."""

    def __init__(self, url: str):
        host, port = url.removeprefix("http://").split(":")
        self.sock = socket.create_connection((host, int(port)))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = b""

    def post(self, path: str, obj: dict) -> dict:
        body = json.dumps(obj).encode()
        self.sock.sendall(
            b"POST %s HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            b"content-length: %d\r\n\r\n" % (path.encode(), len(body)) + body
        )
        while b"\r\n\r\n" not in self.buf:
            self.buf += self.sock.recv(65536)
        head, self.buf = self.buf.split(b"\r\n\r\n", 1)
        n = next(
            int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:")
        )
        while len(self.buf) < n:
            self.buf += self.sock.recv(65536)
        data, self.buf = self.buf[:n], self.buf[n:]
        return json.loads(data)

    def close(self) -> None:
        self.sock.close()


def router(tmp: Path, name: str, shards: int, replicas: int = 1, stats: str = "global", hedge: bool = True):
    cfg = tmp / f"{name}.toml"
    reps = ", ".join(['"local"'] * replicas)
    cfg.write_text(
        f'[search]\ncache_entries = 0\nstats = "{stats}"\nhedge = {str(hedge).lower()}\n'
        f'data_dir = "{tmp / name}"\n'
        + "".join(f'[[shards]]\nname = "s{i}"\nreplicas = [{reps}]\n' for i in range(shards))
    )
    port = free_port()
    log = open(tmp / f"{name}.log", "wb")
    p = subprocess.Popen(
        [sys.executable, "-m", "sluice.cli", "search", "serve", "--port", str(port), "--config", str(cfg)],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    if answers_200(url + "/ready"):
        return p, url
    p.kill()
    raise RuntimeError(f"router {name} not ready: {(tmp / f'{name}.log').read_text()[-2000:]}")


def ingest(http: httpx.Client, url: str, docs) -> float:
    t0 = time.perf_counter()
    for i in range(0, len(docs), 500):
        body = "\n".join(json.dumps(d) for d in docs[i : i + 500])
        r = http.post(url + "/v1/search/documents", content=body)
        r.raise_for_status()
    return len(docs) / (time.perf_counter() - t0)


def measure(http: httpx.Client, url: str, queries, warmup, router_pid: int) -> dict:
    """Two passes over the queries: the first meets most terms for the first time (the router's
    term-statistics cache is cold: phase 1 runs), the second repeats them (warm: one round trip)."""
    client = RawClient(url)
    for q in warmup:  # other queries (the connections, the caches of the code, not the measured terms)
        client.post("/v1/search", {"query": q, "top_k": 10})
    shard_pids = list(http.get(url + "/v1/search/status").json()["local_pids"].values())
    out: dict = {}
    for n_pass in ("", "warm_"):
        cpu0 = cpu_s(router_pid), sum(cpu_s(p) for p in shard_pids)
        lat = []
        partial = 0
        t0 = time.perf_counter()
        for q in queries:
            s = time.perf_counter()
            r = client.post("/v1/search", {"query": q, "top_k": 10})
            lat.append(time.perf_counter() - s)
            partial += r["partial"]
        res = summary(lat, time.perf_counter() - t0)
        cpu1 = cpu_s(router_pid), sum(cpu_s(p) for p in shard_pids)
        res["partial"] = partial
        res["router_cpu_ms_per_query"] = round((cpu1[0] - cpu0[0]) / len(queries) * 1000, 3)
        res["shards_cpu_ms_per_query"] = round((cpu1[1] - cpu0[1]) / len(queries) * 1000, 3)
        out.update({n_pass + k: v for k, v in res.items()})
    client.close()
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--docs", type=int, default=4000)
    ap.add_argument("--queries", type=int, default=300)
    ap.add_argument("--json", help="write the results here too")
    args = ap.parse_args()
    docs = corpus.documents(args.docs)
    queries = corpus.queries(docs, args.queries)
    warmup = corpus.queries(docs, 50, seed=99)
    results: dict = {
        "docs": len(docs),
        "queries": len(queries),
        "load_average_before": os.getloadavg(),
        "library": library(docs, queries),
    }
    print(f"library alone: {results['library']}", flush=True)
    runs = [
        ("1 shard", 1, 1, "global", True),
        ("2 shards", 2, 1, "global", True),
        ("4 shards", 4, 1, "global", True),
        ("2 shards, local stats", 2, 1, "local", True),
        ("2x2 hedge off", 2, 2, "global", False),
        ("2x2 hedge on", 2, 2, "global", True),
    ]
    with (
        tempfile.TemporaryDirectory(prefix="sluice-search-bench-") as d,
        httpx.Client(
            timeout=60, transport=httpx.HTTPTransport(socket_options=[(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)])
        ) as http,
    ):
        for name, shards, reps, stats, hedge in runs:
            p, url = router(Path(d), name.replace(" ", "_").replace(",", ""), shards, reps, stats, hedge)
            try:
                rate = ingest(http, url, docs)
                res = measure(http, url, queries, warmup, p.pid)
                res["ingest_docs_per_s"] = round(rate)
                res["added_p50_ms"] = round(res["p50_ms"] - results["library"]["p50_ms"], 3)
                res["warm_added_p50_ms"] = round(res["warm_p50_ms"] - results["library"]["p50_ms"], 3)
                results[name] = res
                print(f"{name}: {res}", flush=True)
            finally:
                p.send_signal(signal.SIGTERM)
                p.wait(30)
    results["load_average_after"] = os.getloadavg()
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
