#!/usr/bin/env python3
"""CUDA graphs for decode steps, on and off in the same run: per-stream decode tok/s and TTFT at
1 and 32 streams, and kernel launches per decode step (torch.profiler).

Two engines share one random-init model (models/random_init.py), identical but for
EngineConfig.cuda_graphs; each level runs once on each to capture its buckets (warm-up), then
--reps times alternating on / off, and the ratio is the median of the per-rep ratios. Launches:
a few steady decode steps of each engine under torch.profiler, counting the host's kernel-launch
and graph-launch runtime calls and the kernels the GPU ran, per step.

On the CPU (--device cpu, for a dry run) the "on" engine takes the graph path with an eager
stand-in for the capture (engine/decode_graphs.py, EagerReplay): the same padding and buffers,
no graph, so its ratio says nothing about speed.

    PYTHONPATH=src python3 bench/serving/decode_graphs.py --random-init small --dtype bfloat16 --json-out graphs.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from engine_throughput import run_sluice, synthetic_prompts

from sluice.engine.config import EngineConfig
from sluice.engine.decode_graphs import DecodeGraphs, EagerReplay
from sluice.engine.engine import LLMEngine
from sluice.models.random_init import SHAPES, load_random_model
from sluice.types import GenerationRequest, SamplingParams

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: bench.common
from bench.common import log


def make_engine(loaded, graphs: bool, max_seqs: int, blocks: int) -> LLMEngine:
    config = EngineConfig(max_num_seqs=max_seqs, num_kv_blocks=blocks, max_num_batched_tokens=8192, cuda_graphs=graphs)
    engine = LLMEngine(loaded, config)
    if graphs and engine.runner.graphs is None:  # the CPU: the graph path with an eager stand-in
        engine.runner.graphs = DecodeGraphs(
            loaded.model,
            engine.runner.kv_caches,
            config.block_size,
            max_seqs,
            -(-engine.max_model_len // config.block_size),
            capture=EagerReplay,
        )
    return engine


def launches_per_step(engine: LLMEngine, ids: list[list[int]], steps: int) -> dict:
    """Start len(ids) requests, step until every one decodes, then profile `steps` decode steps."""
    from torch.profiler import ProfilerActivity, profile

    engine.kv.reset_prefix_cache()
    params = SamplingParams(max_tokens=steps + 8, temperature=0.0, ignore_eos=True)
    for i, p in enumerate(ids):
        engine.add_request(GenerationRequest(f"prof{i}-{id(engine)}", p, params))
    while any(r.num_output_tokens == 0 for r in engine.scheduler.running) or engine.scheduler.waiting:
        engine.step()
    engine.step()  # one decode step outside the profile (a new bucket's capture happens here)
    cuda = torch.cuda.is_available() and engine.model.device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        for _ in range(steps):
            engine.step()
        if cuda:
            torch.cuda.synchronize()
    while engine.has_unfinished():
        engine.step()
    counts: Counter = Counter()
    for e in prof.key_averages():
        key = e.key
        if "GraphLaunch" in key:
            counts["graph_launches"] += e.count
        elif "LaunchKernel" in key or key in ("cuLaunchKernel", "cuLaunchKernelEx"):
            counts["kernel_launch_calls"] += e.count
        elif "Memcpy" in key and key.startswith(("cuda", "cu")):
            counts["memcpy_calls"] += e.count
        if str(e.device_type).endswith("CUDA") and not key.startswith(("Memcpy", "Memset")):
            counts["gpu_kernels"] += e.count
        if str(e.device_type).endswith("CPU") and key.startswith("aten::"):
            counts["aten_ops"] += e.count
    return {k: v / steps for k, v in counts.items()} | {"steps": steps}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--random-init", choices=sorted(SHAPES), default="small")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--streams", default="1,32", help="comma-separated concurrency levels (default: 1,32)")
    p.add_argument("--out-tokens", type=int, default=64)
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--profile-steps", type=int, default=5)
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (default: 1; the GPU does the work)")
    p.add_argument("--json-out", default=None)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    levels = [int(s) for s in args.streams.split(",")]
    loaded = load_random_model(args.random_init, args.seed, args.dtype, args.device)
    ids = synthetic_prompts(loaded.config.vocab_size, max(levels))
    max_seqs = max(levels)
    blocks = max_seqs * -(-(max(map(len, ids)) + args.out_tokens + 16) // 8) + 64
    engines = {"on": make_engine(loaded, True, max_seqs, blocks), "off": make_engine(loaded, False, max_seqs, blocks)}
    record: dict = {
        "bench": "decode_graphs",
        "model": loaded.config.name,
        "dtype": args.dtype,
        "device": str(loaded.model.device),
        "gpu": torch.cuda.get_device_name(loaded.model.device) if loaded.model.device.type == "cuda" else None,
        "out_tokens": args.out_tokens,
        "levels": {},
    }
    with torch.inference_mode():
        for k in levels:
            for e in engines.values():  # warm-up: captures this level's buckets
                run_sluice(e, ids[:k], args.out_tokens, 1)
            runs: dict[str, list[dict]] = {"on": [], "off": []}
            for rep in range(args.reps):
                for name in ("on", "off") if rep % 2 == 0 else ("off", "on"):
                    runs[name].append(run_sluice(engines[name], ids[:k], args.out_tokens, 1))
            ratios = [a["per_stream_tok_s"] / b["per_stream_tok_s"] for a, b in zip(runs["on"], runs["off"])]
            level: dict[str, Any] = {
                name: {
                    "per_stream_tok_s": statistics.median(r["per_stream_tok_s"] for r in rs),
                    "ttft_ms": statistics.median(r["ttft_ms"] for r in rs),
                    "tok_s": statistics.median(r["tok_s"] for r in rs),
                }
                for name, rs in runs.items()
            }
            level["graphs_vs_eager_per_stream"] = statistics.median(ratios)
            level["per_rep_ratios"] = ratios
            for name, e in engines.items():
                level[name]["launches_per_step"] = launches_per_step(e, ids[:k], args.profile_steps)
            record["levels"][str(k)] = level
            log(
                f"x{k}: per-stream tok/s graphs {level['on']['per_stream_tok_s']:.1f} vs eager "
                f"{level['off']['per_stream_tok_s']:.1f} = {level['graphs_vs_eager_per_stream']:.2f}x; launches/step "
                f"on {level['on']['launches_per_step']}, off {level['off']['launches_per_step']}"
            )
    graphs = engines["on"].runner.graphs
    record["graph_replays"] = graphs.replays if graphs is not None else None
    record["buckets"] = sorted(graphs.graphs) if graphs is not None else []
    record["graph_failure"] = graphs.failure if graphs is not None else None
    print(json.dumps(record), flush=True)
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(record, f)


if __name__ == "__main__":
    main()
