#!/usr/bin/env python3
"""Where single-stream TTFT goes: the engine in a gRPC worker process vs inline, side by side.

Starts two `sluice serve` processes — one with its own `sluice worker` (the default), one with
`--worker inline` (the engine in the HTTP process) — and sends them the same sequential streaming
requests, alternating request by request. For each side it splits the client's TTFT with the
server's own histograms:

- outside generate: client TTFT − the server's generate→first-token time (HTTP parsing, auth,
  tokenizing, safety L1, the gateway, writing the first event);
- engine queue: arrival → first scheduled (in the engine);
- generate → first token: submitting to the engine (over gRPC for the worker) + prefill + the
  first event coming back.
Ends by printing one JSON line.

    .venv/bin/python bench/serving/ttft_breakdown.py [--requests 40]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

import httpx
from httpx_sse import aconnect_sse

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.server_process import MODEL, start_server

HISTOGRAMS = ("sluice_time_to_first_token_seconds", "sluice_queue_time_seconds")


def sums(base_url: str) -> dict[str, tuple[float, float]]:
    out = {name: [0.0, 0.0] for name in HISTOGRAMS}
    for line in httpx.get(base_url + "/metrics", timeout=5).text.splitlines():
        for name in HISTOGRAMS:
            if line.startswith(name + "_sum"):
                out[name][0] += float(line.split()[1])
            elif line.startswith(name + "_count"):
                out[name][1] += float(line.split()[1])
    return {k: (v[0], v[1]) for k, v in out.items()}


async def one(c: httpx.AsyncClient, url: str, i: int) -> float | None:
    body = {
        "model": MODEL,
        "max_tokens": 8,
        "stream": True,
        "temperature": 0,
        "messages": [{"role": "user", "content": f"Tell me something about the number {i}."}],
    }
    t0 = time.perf_counter()
    ttft = None
    async with aconnect_sse(c, "POST", url + "/v1/messages", json=body) as es:
        async for sse in es.aiter_sse():  # read to the end: an abandoned stream would still hold the engine
            if sse.event == "content_block_delta" and ttft is None:
                ttft = time.perf_counter() - t0
    return ttft


async def run(urls: dict[str, str], n: int) -> dict:
    async with httpx.AsyncClient(timeout=120) as c:
        for url in urls.values():
            for i in range(3):
                await one(c, url, 10_000 + i)  # warm-up
        base = {name: sums(url) for name, url in urls.items()}
        ttfts: dict[str, list[float]] = {name: [] for name in urls}
        for i in range(n):
            order = list(urls.items()) if i % 2 == 0 else list(urls.items())[::-1]
            for name, url in order:
                t = await one(c, url, i)
                if t is not None:
                    ttfts[name].append(t)
        out = {}
        for name, url in urls.items():
            now = sums(url)
            (g1, gc1), (q1, qc1) = now[HISTOGRAMS[0]], now[HISTOGRAMS[1]]
            (g0, gc0), (q0, qc0) = base[name][HISTOGRAMS[0]], base[name][HISTOGRAMS[1]]
            gen = (g1 - g0) / max(1.0, gc1 - gc0)
            client = sum(ttfts[name]) / max(1, len(ttfts[name]))
            out[name] = {
                "client_ttft_ms_mean": 1000 * client,
                "generate_to_first_token_ms_mean": 1000 * gen,
                "engine_queue_ms_mean": 1000 * (q1 - q0) / max(1.0, qc1 - qc0),
                "outside_generate_ms_mean": 1000 * (client - gen),
                "requests": len(ttfts[name]),
            }
        return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--requests", type=int, default=40, help="sequential requests per side (default: 40)")
    args = p.parse_args()
    procs = []
    try:
        procs.append(start_server())
        procs.append(start_server(["--worker", "inline"]))
        res = asyncio.run(run({"worker": procs[0].base_url, "inline": procs[1].base_url}, args.requests))
    finally:
        for proc in procs:
            proc.stop()
    for name, r in res.items():
        print(
            f"{name:7s} client TTFT {r['client_ttft_ms_mean']:6.1f} ms = outside generate "
            f"{r['outside_generate_ms_mean']:5.1f} + generate→first token {r['generate_to_first_token_ms_mean']:5.1f} "
            f"(engine queue {r['engine_queue_ms_mean']:.1f})",
            file=sys.stderr,
        )
    print(json.dumps(res))


if __name__ == "__main__":
    main()
