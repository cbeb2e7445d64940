#!/usr/bin/env python3
"""Load benchmark for `sluice serve`: TTFT, inter-token latency, throughput, errors.

Closed loop at 1 / 8 / 32 concurrent streams and an open-loop Poisson arrival rate, against a
real `sluice serve` on 127.0.0.1 (started by this script unless --url is given); then the same
closed-loop load sent straight to an in-process engine, to give the HTTP + gRPC worker overhead
as a ratio. HTTP and in-process runs alternate (--rounds) so machine noise hits both alike.
Everything is bounded: a fixed number of requests per level and a fixed open-loop duration.
Ends by printing one JSON line of its figures.

    .venv/bin/python bench/serving/serve_load.py            # full run (~10 min on 2 cores)
    .venv/bin/python bench/serving/serve_load.py --quick    # smoke run (~2 min)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path

import httpx
from httpx_sse import aconnect_sse
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.common import PROMPT_TOPICS, pct
from tests.server_process import MODEL, start_server

TOPICS = PROMPT_TOPICS


def prompt(i: int) -> str:
    return f"Write a short paragraph about {TOPICS[i % len(TOPICS)]} (note {i})."


class Recorder:
    def __init__(self) -> None:
        self.ttft: list[float] = []
        self.itl: list[float] = []
        self.tokens = 0
        self.errors = 0
        self.per_stream: list[float] = []

    def summary(self, wall: float) -> dict:
        return {
            "ttft_p50_ms": 1000 * pct(self.ttft, 0.5),
            "ttft_p99_ms": 1000 * pct(self.ttft, 0.99),
            "itl_p50_ms": 1000 * pct(self.itl, 0.5),
            "itl_p99_ms": 1000 * pct(self.itl, 0.99),
            "output_tok_s": self.tokens / wall if wall else 0.0,
            "per_stream_tok_s": statistics.median(self.per_stream) if self.per_stream else 0.0,
            "errors": self.errors,
            "requests": len(self.ttft),
        }


async def http_stream(client: httpx.AsyncClient, url: str, i: int, max_tokens: int, rec: Recorder) -> None:
    body = {
        "model": MODEL,
        "max_tokens": max_tokens,
        "stream": True,
        "temperature": 0,
        "messages": [{"role": "user", "content": prompt(i)}],
    }
    t0 = time.perf_counter()
    first: float | None = None
    last = t0  # read once a first token came
    n = 0
    try:
        async with aconnect_sse(client, "POST", url + "/v1/messages", json=body) as es:
            if es.response.status_code != 200:
                rec.errors += 1
                return
            async for sse in es.aiter_sse():
                if sse.event == "content_block_delta":
                    now = time.perf_counter()
                    if first is None:
                        first = now
                        rec.ttft.append(now - t0)
                    else:
                        rec.itl.append(now - last)
                    last = now
                elif sse.event == "message_delta":
                    n = json.loads(sse.data)["usage"]["output_tokens"]
                elif sse.event == "error":
                    rec.errors += 1
    except httpx.HTTPError:
        rec.errors += 1
        return
    rec.tokens += n
    if first is not None and last is not None and n > 1 and last > first:
        rec.per_stream.append((n - 1) / (last - first))


async def closed_loop(concurrency: int, total: int, one) -> tuple[Recorder, float]:
    rec = Recorder()
    queue = list(range(total))

    async def worker() -> None:
        while queue:
            await one(queue.pop(), rec)

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return rec, time.perf_counter() - t0


async def open_loop(rate: float, duration: float, one, seed: int = 0) -> tuple[Recorder, float]:
    rec = Recorder()
    rng = random.Random(seed)
    tasks = []
    t0 = time.perf_counter()
    i = 0
    while time.perf_counter() - t0 < duration:
        tasks.append(asyncio.create_task(one(i, rec)))
        i += 1
        await asyncio.sleep(rng.expovariate(rate))
    await asyncio.gather(*tasks)
    return rec, time.perf_counter() - t0


class InProcess:
    """The same requests straight into an AsyncEngine in this process (no HTTP, no gRPC)."""

    def __init__(self) -> None:
        from sluice.engine.async_engine import AsyncEngine
        from sluice.engine.config import EngineConfig
        from sluice.engine.engine import LLMEngine
        from sluice.models.loader import load_model

        def build() -> LLMEngine:  # load on the engine thread, as the worker does
            self.loaded = load_model(progress=False)
            return LLMEngine(self.loaded, EngineConfig())

        self.engine = AsyncEngine(factory=build).start()
        self.n = 0

    async def one(self, i: int, max_tokens: int, rec: Recorder) -> None:
        from sluice.types import GenerationRequest, SamplingParams

        ids = self.loaded.tokenizer.encode_chat([{"role": "user", "content": prompt(i)}])
        self.n += 1
        req = GenerationRequest(f"b{self.n}", ids, SamplingParams(max_tokens=max_tokens, temperature=0))
        t0 = time.perf_counter()
        first: float | None = None
        last = t0  # read once a first token came
        n = 0
        async for ev in self.engine.generate(req):
            now = time.perf_counter()
            if ev.text:
                if first is None:
                    first = now
                    rec.ttft.append(now - t0)
                else:
                    rec.itl.append(now - last)
                last = now
            n = ev.usage.output_tokens
        rec.tokens += n
        if first is not None and n > 1 and last > first:
            rec.per_stream.append((n - 1) / (last - first))


async def main_async(args: argparse.Namespace) -> dict:
    levels = [1, 8, 32]
    results: dict = {"closed_loop": {}, "in_process": {}, "config": vars(args)}
    proc = None
    url = args.url
    if url is None:
        print("starting sluice serve ...", file=sys.stderr)
        proc = start_server()
        url = proc.base_url
    inproc = InProcess()
    await inproc.engine.wait_loaded()
    per_level = {c: max(args.min_requests, 2 * c) for c in levels}
    try:
        limits = httpx.Limits(max_connections=200, max_keepalive_connections=200)
        async with httpx.AsyncClient(timeout=300, limits=limits) as client:
            await http_stream(client, url, 0, 4, Recorder())  # warm-up
            bar = tqdm(total=args.rounds * len(levels) * 2, desc="closed loop", file=sys.stderr)
            runs: dict = {}
            for _ in range(args.rounds):
                for c in levels:
                    rec, wall = await closed_loop(
                        c, per_level[c], lambda i, r: http_stream(client, url, i, args.max_tokens, r)
                    )
                    runs.setdefault(("http", c), []).append(rec.summary(wall))
                    bar.update()
                    rec, wall = await closed_loop(c, per_level[c], lambda i, r: inproc.one(i, args.max_tokens, r))
                    runs.setdefault(("inproc", c), []).append(rec.summary(wall))
                    bar.update()
            bar.close()
            for (kind, c), summaries in runs.items():
                best = max(summaries, key=lambda s: s["output_tok_s"])
                med = {k: statistics.median(s[k] for s in summaries) for k in summaries[0]}
                target = results["closed_loop" if kind == "http" else "in_process"]
                target[str(c)] = {"median": med, "best": best}
            print(f"open loop: {args.rate} req/s for {args.duration}s ...", file=sys.stderr)
            rec, wall = await open_loop(
                args.rate, args.duration, lambda i, r: http_stream(client, url, i, args.max_tokens, r)
            )
            results["open_loop"] = {"rate_rps": args.rate, **rec.summary(wall)}
    finally:
        inproc.engine.shutdown()
        if proc is not None:
            proc.stop()
    h32, i32 = results["closed_loop"]["32"]["median"], results["in_process"]["32"]["median"]
    h8, i8 = results["closed_loop"]["8"]["median"], results["in_process"]["8"]["median"]
    results["overhead"] = {
        "throughput_ratio_32": h32["output_tok_s"] / i32["output_tok_s"] if i32["output_tok_s"] else None,
        "added_ttft_p50_ms_8": h8["ttft_p50_ms"] - i8["ttft_p50_ms"],
        "added_ttft_p50_ms_1": results["closed_loop"]["1"]["median"]["ttft_p50_ms"]
        - results["in_process"]["1"]["median"]["ttft_p50_ms"],
    }
    results["targets"] = {
        "ttft_p50_8_under_200ms": h8["ttft_p50_ms"] < 200,
        "per_stream_8_at_least_25_tok_s": h8["per_stream_tok_s"] >= 25,
        "aggregate_32_above_120_tok_s": h32["output_tok_s"] > 120,
        "overhead_32_within_5pct": results["overhead"]["throughput_ratio_32"] is not None
        and results["overhead"]["throughput_ratio_32"] >= 0.95,
        "added_ttft_p50_within_2ms": results["overhead"]["added_ttft_p50_ms_1"] <= 2,
    }
    return results


def report(results: dict) -> None:
    print(
        f"\n{'load':<14}{'TTFT p50':>10}{'p99':>9}{'ITL p50':>9}{'p99':>8}{'tok/s':>9}{'stream':>8}{'err':>5}",
        file=sys.stderr,
    )
    for kind in ("closed_loop", "in_process"):
        for c, r in results[kind].items():
            m = r["median"]
            label = f"{'http' if kind == 'closed_loop' else 'engine'} x{c}"
            print(
                f"{label:<14}{m['ttft_p50_ms']:>9.0f}ms{m['ttft_p99_ms']:>7.0f}ms{m['itl_p50_ms']:>7.0f}ms{m['itl_p99_ms']:>6.0f}ms"
                f"{m['output_tok_s']:>9.1f}{m['per_stream_tok_s']:>8.1f}{m['errors']:>5.0f}",
                file=sys.stderr,
            )
    o = results["open_loop"]
    print(
        f"open {o['rate_rps']}/s   {o['ttft_p50_ms']:>9.0f}ms{o['ttft_p99_ms']:>7.0f}ms"
        f"{o['itl_p50_ms']:>7.0f}ms{o['itl_p99_ms']:>6.0f}ms"
        f"{o['output_tok_s']:>9.1f}{o['per_stream_tok_s']:>8.1f}{o['errors']:>5.0f}",
        file=sys.stderr,
    )
    print(f"overhead: {results['overhead']}", file=sys.stderr)
    for name, ok in results["targets"].items():
        print(f"  {'met    ' if ok else 'NOT met'}  {name}", file=sys.stderr)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", default=None, help="benchmark a running server instead of starting one")
    p.add_argument("--max-tokens", type=int, default=64, help="output tokens per request (default: 64)")
    p.add_argument("--rounds", type=int, default=2, help="alternating HTTP / in-process rounds per level (default: 2)")
    p.add_argument(
        "--min-requests", type=int, default=8, help="requests per level at least (default: 8; else 2x concurrency)"
    )
    p.add_argument("--rate", type=float, default=2.0, help="open-loop arrivals per second (default: 2)")
    p.add_argument("--duration", type=float, default=30.0, help="open-loop duration in seconds (default: 30)")
    p.add_argument("--quick", action="store_true", help="one round, short open loop, 24 tokens: a smoke run")
    args = p.parse_args()
    if args.quick:
        args.rounds, args.duration, args.max_tokens, args.min_requests = 1, 8.0, 24, 4
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    results = asyncio.run(main_async(args))
    report(results)
    print(json.dumps(results, default=str))


if __name__ == "__main__":
    main()
