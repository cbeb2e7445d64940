#!/usr/bin/env python3
"""What the safety layers cost, side by side in one run.

1. In-process: L1 (input rules) per request and L3 (stream guard) per token on the benign set
   in tests/data/safety_benign.txt, the L2 classifier per call, and the mean hold-back in characters.
2. Over HTTP: two `sluice serve` processes sharing one worker, safety on vs off, alternated
   request by request for latency and burst by burst at 32 (the side that goes first swaps
   each round), so drift on a shared machine lands on both sides:
   TTFT p50/p99, inter-token latency, end-of-stream time (last delta → message_stop), and
   output tokens/s at 32 concurrent streams.
Ends by printing one JSON line of its figures.

    .venv/bin/python bench/serving/safety_overhead.py [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: bench.common
import httpx
from httpx_sse import aconnect_sse

from bench.common import pct

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from sluice.safety.pipeline import SafetyPipeline
from sluice.safety.verdict import Layer
from tests.server_process import MODEL, start_server, start_worker


def in_process() -> dict:
    safety = SafetyPipeline.from_file()
    lines = (ROOT / "tests/data/safety_benign.txt").read_text().splitlines()
    items = [line for line in lines if line and not line.startswith("#")]
    l1 = []
    for text in items:
        t0 = time.perf_counter()
        safety.check_input(["You are a helpful assistant.", text])
        l1.append(time.perf_counter() - t0)
    per_token, holdback = [], []
    for text in items:
        guard = safety.stream_guard()
        for i in range(0, len(text), 4):
            t0 = time.perf_counter()
            guard.feed(text[i : i + 4])
            per_token.append(time.perf_counter() - t0)
        guard.finish()
        holdback.append(guard.mean_holdback)

    async def classify() -> list[float]:
        times = []
        for text in items[:100]:
            t0 = time.perf_counter()
            await safety.classify(text, Layer.L2)
            times.append(time.perf_counter() - t0)
        return times

    l2 = asyncio.run(classify())
    return {
        "l1_us_p50": 1e6 * pct(l1, 0.5),
        "l1_us_p99": 1e6 * pct(l1, 0.99),
        "l3_us_per_token_p50": 1e6 * pct(per_token, 0.5),
        "l3_us_per_token_p99": 1e6 * pct(per_token, 0.99),
        "l2_ms_p50": 1000 * pct(l2, 0.5),
        "l2_ms_p99": 1000 * pct(l2, 0.99),
        "mean_holdback_chars": statistics.mean(holdback),
    }


async def one(c: httpx.AsyncClient, url: str, i: int, rec: dict[str, Any]) -> None:
    body = {
        "model": MODEL,
        "max_tokens": 48,
        "stream": True,
        "temperature": 0.7,
        "seed": i,
        "messages": [{"role": "user", "content": f"Tell me something about the number {i}."}],
    }
    t0 = time.perf_counter()
    first: float | None = None
    last = t0  # read once a first token came
    async with aconnect_sse(c, "POST", url + "/v1/messages", json=body) as es:
        async for sse in es.aiter_sse():
            now = time.perf_counter()
            if sse.event == "content_block_delta":
                if first is None:
                    first = now
                    rec["ttft"].append(now - t0)
                    rec.setdefault("ttft_by_seed", {})[i] = now - t0
                else:
                    rec["itl"].append(now - last)
                last = now
            elif sse.event == "message_delta":
                rec["tokens"] += json.loads(sse.data)["usage"]["output_tokens"]
            elif sse.event == "message_stop" and last is not None:
                rec["end"].append(now - last)


async def http(on_url: str, off_url: str, rounds: int, singles: int) -> dict:
    out: dict = {}
    async with httpx.AsyncClient(timeout=300, limits=httpx.Limits(max_connections=64)) as c:
        for url in (on_url, off_url):
            await one(c, url, 0, {"ttft": [], "itl": [], "end": [], "tokens": 0})  # warm-up
        recs: dict[str, dict[str, Any]] = {
            k: {"ttft": [], "itl": [], "end": [], "tokens": 0, "tps": []} for k in ("on", "off")
        }
        for r in range(rounds):
            order = (("on", on_url), ("off", off_url))
            if r % 2:
                order = order[::-1]  # neither side always goes first
            for i in range(singles):  # sequential (latency without queueing), on and off interleaved
                for name, url in order:
                    await one(c, url, 1000 * r + i, recs[name])
            for name, url in order:
                rec = recs[name]
                burst: dict[str, Any] = {"ttft": [], "itl": [], "end": [], "tokens": 0}
                t0 = time.perf_counter()
                await asyncio.gather(*(one(c, url, 5000 + 100 * r + i, burst) for i in range(32)))
                rec["tps"].append(burst["tokens"] / (time.perf_counter() - t0))
        for name, rec in recs.items():
            out[name] = {
                "ttft_ms_p50": 1000 * pct(rec["ttft"], 0.5),
                "ttft_ms_p99": 1000 * pct(rec["ttft"], 0.99),
                "itl_ms_p50": 1000 * pct(rec["itl"], 0.5),
                "end_ms_p50": 1000 * pct(rec["end"], 0.5),
                "tok_s_32": statistics.median(rec["tps"]),
            }
    # paired: the same seed on both sides samples the same reply, so per-request differences
    # cancel what the prompt and reply length contribute
    by_on, by_off = recs["on"].get("ttft_by_seed", {}), recs["off"].get("ttft_by_seed", {})
    paired = [by_on[k] - by_off[k] for k in by_on.keys() & by_off.keys()]
    on, off = out["on"], out["off"]
    out["added"] = {
        "ttft_ms_paired_p50": 1000 * statistics.median(paired) if paired else float("nan"),
        "ttft_ms_p50": on["ttft_ms_p50"] - off["ttft_ms_p50"],
        "ttft_ms_p99": on["ttft_ms_p99"] - off["ttft_ms_p99"],
        "itl_ms_p50": on["itl_ms_p50"] - off["itl_ms_p50"],
        "end_ms_p50": on["end_ms_p50"] - off["end_ms_p50"],
        "throughput_ratio_32": on["tok_s_32"] / off["tok_s_32"],
    }
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=3, help="alternating on/off rounds (default: 3)")
    p.add_argument("--singles", type=int, default=10, help="sequential requests per round (default: 10)")
    p.add_argument("--quick", action="store_true", help="1 round, 4 sequential requests")
    p.add_argument("--policy", metavar="FILE", help="the safety policy of the 'on' server (default: the built-in one)")
    args = p.parse_args()
    if args.quick:
        args.rounds, args.singles = 1, 4
    lib = in_process()
    print(f"in-process: {lib}", file=sys.stderr)
    address = f"unix:{Path(tempfile.mkdtemp(prefix='sluice-sb-')) / 'w.sock'}"
    # no prefix cache: both sides send the same prompts (same seeds, same replies), and the side
    # that went second would otherwise find the other's prompt cached and look faster
    procs = [start_worker(address, ["--no-prefix-caching"])]
    try:
        on = start_server(["--worker", address], env={"SLUICE_SAFETY_POLICY": args.policy} if args.policy else None)
        procs.append(on)
        off = start_server(["--worker", address], env={"SLUICE_SAFETY": "false"})
        procs.append(off)
        res = asyncio.run(http(on.base_url, off.base_url, args.rounds, args.singles))
    finally:
        for proc in reversed(procs):
            proc.stop()
    print(f"http: {res}", file=sys.stderr)
    added = res["added"]
    targets = {
        "added_ttft_p50_under_5ms": added["ttft_ms_p50"] <= 5,
        "mean_holdback_at_most_one_token": lib["mean_holdback_chars"] <= 4,
        "throughput_loss_under_3pct_at_32": added["throughput_ratio_32"] >= 0.97,
    }
    for k, ok in targets.items():
        print(f"  {'met    ' if ok else 'NOT met'}  {k}", file=sys.stderr)
    print(json.dumps({"in_process": lib, "http": res, "targets": targets}))


if __name__ == "__main__":
    main()
