#!/usr/bin/env python3
"""Search: an earlier version of the code against this one, side by side in one run.

Two routers — one running the `src/` of an earlier checkout (`git worktree add /tmp/old <commit>`),
one running this tree's — each with 2 local shard replicas, the same corpus and queries, result
cache off; blocks of 25 queries alternate between them (so load changes hit both alike), sent by
a raw keep-alive socket client. Prints p50/p99 and the CPU time per query of each router and
of its shard processes (from /proc), which a loaded machine distorts much less than latency.

    PYTHONPATH=src .venv/bin/python bench/search_before_after.py --before /tmp/old/src
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

import httpx

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))
sys.path.insert(0, str(HERE))
from sluice.search import corpus  # noqa: E402
from search_latency import RawClient, cpu_s, pct  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--before", required=True, help="the src/ folder of the earlier checkout")
ap.add_argument("--docs", type=int, default=3000)
ap.add_argument("--queries", type=int, default=300)
args = ap.parse_args()



def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    docs = corpus.documents(args.docs)
    queries = corpus.queries(docs, args.queries)
    tmp = Path(tempfile.mkdtemp(prefix="sluice-search-ab-"))
    routers = {}
    for name, src in (("before", args.before), ("after", str(HERE.parent / "src"))):
        cfg = tmp / f"{name}.toml"
        cfg.write_text(f'[search]\ncache_entries = 0\ndata_dir = "{tmp}/{name}"\n'
                       + "".join(f'[[shards]]\nname = "s{i}"\nreplicas = ["local"]\n' for i in range(2)))
        port = free_port()
        env = dict(os.environ, PYTHONPATH=os.path.abspath(src))
        p = subprocess.Popen([sys.executable, "-m", "sluice.cli", "search", "serve", "--port", str(port),
                              "--config", str(cfg)], stdout=open(tmp / f"{name}.log", "wb"),
                             stderr=subprocess.STDOUT, env=env)
        routers[name] = (p, f"http://127.0.0.1:{port}")
    try:
        http = httpx.Client(timeout=60)
        for name, (p, url) in routers.items():
            for _ in range(600):
                try:
                    if http.get(url + "/ready").status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                time.sleep(0.2)
            for i in range(0, len(docs), 500):
                body = "\n".join(json.dumps(d) for d in docs[i:i + 500])
                http.post(url + "/v1/search/documents", content=body).raise_for_status()
        clients = {n: RawClient(u) for n, (p, u) in routers.items()}
        pids = {n: [p.pid, *http.get(u + "/v1/search/status").json()["local_pids"].values()]
                for n, (p, u) in routers.items()}
        for c in clients.values():
            for q in queries[:50]:
                c.post("/v1/search", {"query": q, "top_k": 10})
        lat: dict[str, list[float]] = {n: [] for n in routers}
        cpu = {n: [0.0, 0.0] for n in routers}
        for block in range(0, len(queries), 25):
            for n, c in clients.items():
                c0 = [cpu_s(x) for x in pids[n]]
                for q in queries[block:block + 25]:
                    t = time.perf_counter()
                    c.post("/v1/search", {"query": q, "top_k": 10})
                    lat[n].append(time.perf_counter() - t)
                c1 = [cpu_s(x) for x in pids[n]]
                cpu[n][0] += c1[0] - c0[0]
                cpu[n][1] += sum(c1[1:]) - sum(c0[1:])
        out = {n: {"p50_ms": round(pct(lat[n], 0.5) * 1000, 2), "p99_ms": round(pct(lat[n], 0.99) * 1000, 2),
                   "router_cpu_ms_per_query": round(cpu[n][0] / len(queries) * 1000, 3),
                   "shards_cpu_ms_per_query": round(cpu[n][1] / len(queries) * 1000, 3)} for n in routers}
        print(json.dumps(out, indent=2))
    finally:
        for p, _ in routers.values():
            p.send_signal(signal.SIGTERM)
            p.wait(30)


if __name__ == "__main__":
    main()
