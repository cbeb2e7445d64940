#!/usr/bin/env python3
"""Served throughput with LoRA adapters (docs/BENCHMARKS.md, "LoRA"): one `sluice serve` (the
bundled model, one spawned worker, 8 rank-16 adapters on every linear registered with
--lora-modules), then rounds that alternate two closed loops of S concurrent streaming chat
requests (default 32): every request on the base model, and the requests spread evenly over
the 8 adapters. Every reply generates exactly --max-tokens tokens (ignore_eos), so both loads do
the same work; the figure is the aggregate output tok/s of each, summed over the rounds, and
their ratio (adapters / base). The adapters are random (written by bench/common.py), so their
text is noise; the work per token is what is measured. The last stdout line is one JSON object.

    PYTHONPATH=src .venv/bin/python bench/serving/lora_serving.py --streams 32 --rounds 3
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.common import log, write_lora_adapter
from bench.serving.fleet_common import MODEL
from tests.server_process import start_server


async def one(client: httpx.AsyncClient, url: str, model: str, i: int, max_tokens: int) -> int:
    body = {
        "model": model,
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": False,
        "messages": [{"role": "user", "content": f"Write a short story about a lighthouse keeper (note {i})."}],
    }
    r = await client.post(url + "/v1/chat/completions", json=body)
    r.raise_for_status()
    return r.json()["usage"]["completion_tokens"]


async def closed_loop(url: str, models: list[str], streams: int, requests: int, max_tokens: int) -> tuple[int, float]:
    async with httpx.AsyncClient(timeout=600, limits=httpx.Limits(max_connections=streams + 4)) as client:
        sem = asyncio.Semaphore(streams)

        async def bounded(i: int) -> int:
            async with sem:
                return await one(client, url, models[i % len(models)], i, max_tokens)

        t0 = time.perf_counter()
        tokens = sum(await asyncio.gather(*(bounded(i) for i in range(requests))))
        return tokens, time.perf_counter() - t0


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--streams", type=int, default=32)
    p.add_argument("--adapters", type=int, default=8)
    p.add_argument("--rank", type=int, default=16)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--requests", type=int, default=64, help="requests per load per round (default 2 x streams)")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument(
        "--speculative-tokens",
        type=int,
        default=3,
        help="the server's speculative decoding (default 3, serve's default; 0 = off)",
    )
    p.add_argument("--std", type=float, default=0.002, help="the random adapters' weight spread (default 0.002)")
    args = p.parse_args(argv)

    from sluice.models.bundled import default_model_path
    from sluice.models.gguf.metadata import file_config, open_gguf

    cfg = file_config(open_gguf(default_model_path()))
    root = Path(tempfile.mkdtemp(prefix="sluice-lora-serve-"))
    names = [f"a{i}" for i in range(args.adapters)]
    modules = [f"{n}={write_lora_adapter(root / n, cfg, args.rank, seed=i, std=args.std)}" for i, n in enumerate(names)]
    server = start_server(
        [
            "--lora-modules",
            *modules,
            "--max-loras",
            str(args.adapters),
            "--speculative-tokens",
            str(args.speculative_tokens),
        ],
        timeout=600,
    )
    try:
        totals = {"base": [0, 0.0], "lora": [0, 0.0]}
        asyncio.run(closed_loop(server.base_url, [MODEL, *names], args.streams, args.streams, 8))  # warm-up
        for r in range(args.rounds):
            order = [("base", [MODEL]), ("lora", names)]
            for label, models in order if r % 2 == 0 else order[::-1]:
                tokens, wall = asyncio.run(
                    closed_loop(server.base_url, models, args.streams, args.requests, args.max_tokens)
                )
                totals[label][0] += tokens
                totals[label][1] += wall
                log(f"round {r + 1} {label}: {tokens / wall:.1f} tok/s")
    finally:
        server.stop()
    tok_s = {label: tokens / wall for label, (tokens, wall) in totals.items()}
    result = {
        "streams": args.streams,
        "adapters": args.adapters,
        "rank": args.rank,
        "max_tokens": args.max_tokens,
        "speculative_tokens": args.speculative_tokens,
        "std": args.std,
        "base_tok_s": tok_s["base"],
        "lora_tok_s": tok_s["lora"],
        "ratio": tok_s["lora"] / tok_s["base"],
        "load": os.getloadavg(),
    }
    print(
        f"{args.streams} streams: base {tok_s['base']:.1f} tok/s, over {args.adapters} adapters "
        f"{tok_s['lora']:.1f} tok/s, ratio {result['ratio']:.3f}"
    )
    print(json.dumps(result))


if __name__ == "__main__":
    main()
