#!/usr/bin/env python3
"""Decode speed at long context with the fp32 K/V cache and the opt-in 16-bit one, side by side.

Engines on one loaded model (the CPU kernels), one per (numerics, kv_cache_dtype) pair asked
for, each given the same single request with a prompt of --contexts tokens (an English text
repeated), then stepped in turn, one decode step each, the lead rotating every round, so a burst
of other work on the shared machine lands on all alike. Per context and engine: the median
decode step (wall, and this thread's CPU time, which with --threads 1 counts the step's work
however long other processes held the cores) and per-stream tok/s from it; ratios float16 /
auto within the same numerics, over paired steps. Ends with one JSON line.

    PYTHONPATH=src .venv/bin/python bench/kernels/kv_cache_dtype.py [--contexts 70,378,1368] [--steps 24]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch

SENTENCE = (
    "The keeper climbed the steps each evening, trimmed the wick, wound the clockwork and wrote the weather "
    "in a leather book while ships passed in the night. "
)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--contexts", default="70,378,1368", help="prompt lengths in tokens (default: 70,378,1368)")
    p.add_argument("--steps", type=int, default=24, help="decode steps per engine and context (default: 24)")
    p.add_argument("--threads", type=int, default=1, help="torch threads (default: 1)")
    p.add_argument("--numerics", default="fast,exact", help="numerics to measure (default: fast,exact)")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    from sluice.engine.config import EngineConfig
    from sluice.engine.engine import LLMEngine
    from sluice.models.loader import load_model
    from sluice.types import GenerationRequest, SamplingParams

    loaded = load_model(progress=False)
    if not loaded.model.uses_kernels:
        raise SystemExit("the CPU kernels are unavailable here")
    pairs = [(n, kv) for n in args.numerics.split(",") for kv in ("auto", "float16")]
    engines = {
        pair: LLMEngine(loaded, EngineConfig(numerics=pair[0], kv_cache_dtype=pair[1], speculative_tokens=0))
        for pair in pairs
    }
    text = loaded.tokenizer.encode(SENTENCE * 200)
    result: dict = {"threads": args.threads, "steps": args.steps}
    print(
        f"{'context':>7} {'numerics':>8} {'kv':>8} {'wall ms':>8} {'CPU ms':>7} {'tok/s (CPU)':>11} {'16/32 CPU':>9}",
        file=sys.stderr,
    )
    for ctx in (int(c) for c in args.contexts.split(",")):
        ids = text[:ctx]
        params = SamplingParams(max_tokens=args.steps + 4, temperature=0.0, ignore_eos=True)
        for i, e in enumerate(engines.values()):
            e.kv.reset_prefix_cache()
            e.add_request(GenerationRequest(f"c{ctx}-{i}", ids, params))
            while e.stats().num_running == 0 or e.requests[f"c{ctx}-{i}"].num_output_tokens < 2:
                e.step()  # the prefill (chunked) and a first decode, not timed
        wall: dict = {pair: [] for pair in engines}
        cpu: dict = {pair: [] for pair in engines}
        order = list(engines)
        for s in range(args.steps):
            for pair in order[s % len(order) :] + order[: s % len(order)]:
                c0, w0 = time.thread_time(), time.perf_counter()
                engines[pair].step()
                wall[pair].append(1000 * (time.perf_counter() - w0))
                cpu[pair].append(1000 * (time.thread_time() - c0))
        for e in engines.values():
            for rid in list(e.requests):
                e.abort_request(rid)
        row: dict = {}
        for pair in engines:
            numerics, kv = pair
            w, c = statistics.median(wall[pair]), statistics.median(cpu[pair])
            ratio = None
            if kv == "float16":
                base = (numerics, "auto")
                ratio = statistics.median(a / b for a, b in zip(cpu[pair], cpu[base]))
            row[f"{numerics}/{kv}"] = {
                "wall_ms": w,
                "cpu_ms": c,
                "tok_s_cpu": 1000 / c,
                **({"ratio_cpu_vs_fp32_cache": ratio} if ratio is not None else {}),
            }
            print(
                f"{ctx:7d} {numerics:>8} {kv:>8} {w:8.2f} {c:7.2f} {1000 / c:11.1f} "
                f"{'' if ratio is None else f'{ratio:9.3f}'}",
                file=sys.stderr,
                flush=True,
            )
        result[f"ctx{ctx}"] = row
    result["load"] = os.getloadavg()
    print(f"load average {result['load']}", file=sys.stderr)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
