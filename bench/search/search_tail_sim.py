#!/usr/bin/env python3
"""Search: fan-out tail latency at 100 shards, simulated from a measured shard latency
distribution, with and without hedging (docs/SEARCH.md, "Toward 1B documents").

1. Measure: one `sluice search shard` process with the corpus (Debian descriptions + Zipf),
   `--samples` search requests from this process, one at a time (HTTP round trip included).
2. Simulate `--trials` queries fanned out to `--shards` shards, each shard's latency an
   independent draw from the measured samples: a query takes the slowest shard's time.
   Hedged: a shard whose first draw exceeds the measured p95 also gets a second request at
   p95, and answers at min(first, p95 + second draw) — what the router does. Run twice: on the
   measured samples as they are, and with `--stall-rate` of requests stalled by `--stall-ms`
   (the rare slow replica hedging exists for; a quiet machine's distribution has no such tail).

    PYTHONPATH=src .venv/bin/python bench/search/search_tail_sim.py [--docs 3000] [--samples 400] [--shards 100]
"""

from __future__ import annotations

import argparse
import json
import random
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the root: tests/corpus.py

from sluice.search.index.analyzer import Analyzer
from sluice.search.index.query_tree import resolve
from tests import corpus


def pct(xs, q):
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


def measure(docs, queries, samples: int) -> list[float]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as d:
        p = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "sluice.cli",
                "search",
                "shard",
                "--listen",
                f"127.0.0.1:{port}",
                "--data",
                d,
                "--no-fsync",
            ],
            stderr=subprocess.DEVNULL,
        )
        url = f"http://127.0.0.1:{port}"
        http = httpx.Client(
            timeout=60, transport=httpx.HTTPTransport(socket_options=[(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)])
        )
        try:
            for _ in range(600):
                try:
                    http.get(url + "/health")
                    break
                except httpx.HTTPError:
                    time.sleep(0.2)
            ops = [{"op": "upsert", "id": x["id"], "fields": {k: v for k, v in x.items() if k != "id"}} for x in docs]
            http.post(url + "/v1/shard/append", json={"seq": 1, "ops": ops}).raise_for_status()
            a = Analyzer()
            trees = [resolve(q, a) for q in queries]
            lat = []
            for i in range(samples + 50):
                t = time.perf_counter()
                http.post(
                    url + "/v1/shard/search", json={"tree": trees[i % len(trees)], "top_k": 10}
                ).raise_for_status()
                if i >= 50:
                    lat.append(time.perf_counter() - t)
            return lat
        finally:
            p.terminate()
            p.wait(30)


def simulate(
    lat: list[float],
    shards: int,
    trials: int,
    hedge: bool,
    rng: random.Random,
    stall_rate: float = 0.0,
    stall_s: float = 0.0,
) -> list[float]:
    p95 = pct(lat, 0.95)

    def draw() -> float:
        return rng.choice(lat) + (stall_s if rng.random() < stall_rate else 0.0)

    out = []
    for _ in range(trials):
        worst = 0.0
        for _ in range(shards):
            x = draw()
            if hedge and x > p95:
                x = min(x, p95 + draw())
            worst = max(worst, x)
        out.append(worst)
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--docs", type=int, default=3000)
    ap.add_argument("--samples", type=int, default=400)
    ap.add_argument("--shards", type=int, default=100)
    ap.add_argument("--trials", type=int, default=5000)
    ap.add_argument(
        "--stall-rate",
        type=float,
        default=0.01,
        help="also simulate this fraction of shard requests stalling (a GC pause, a noisy neighbour)",
    )
    ap.add_argument("--stall-ms", type=float, default=200.0)
    args = ap.parse_args()
    docs = corpus.documents(args.docs)
    lat = measure(docs, corpus.queries(docs, 300), args.samples)
    rng = random.Random(3)
    ms = lambda x: round(x * 1000, 2)  # noqa: E731
    res = {"one_shard": {"p50_ms": ms(pct(lat, 0.5)), "p95_ms": ms(pct(lat, 0.95)), "p99_ms": ms(pct(lat, 0.99))}}
    for stall in (0.0, args.stall_rate):
        for hedge in (False, True):
            q = simulate(lat, args.shards, args.trials, hedge, rng, stall, args.stall_ms / 1000)
            name = f"{args.shards}_shards_{'hedged' if hedge else 'plain'}" + (f"_stalls_{stall:g}" if stall else "")
            res[name] = {"p50_ms": ms(pct(q, 0.5)), "p99_ms": ms(pct(q, 0.99))}
    print(json.dumps(res, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
