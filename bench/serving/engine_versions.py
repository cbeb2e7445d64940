#!/usr/bin/env python3
"""The engine alone, before vs after a change: two checkouts, one workload, side by side.

Each measurement is a fresh subprocess with `PYTHONPATH=<checkout>/src` that loads the bundled
model (the portable fp32 torch path unless `--kernels auto`: a checkout without the CPU kernels
only has that path), builds `LLMEngine` with its default config, submits K greedy requests at
once (EOS ignored, so lengths are exact) and steps until done. It reports CPU time per output
token (`time.process_time`: all of the process's threads, so it does not depend on how long
other processes held the cores — but with 2+ torch threads OpenMP's spin-waits count too) and
wall time per step. The sides alternate per round, the lead alternating too; the figures to
quote are the after / before ratios of the medians.

    git worktree add /tmp/sluice-before b6b409b
    .venv/bin/python bench/serving/engine_versions.py --before /tmp/sluice-before --threads 1 --rounds 3
    .venv/bin/python bench/serving/engine_versions.py --before /tmp/sluice-before --threads 2 --streams 1 8 32

This separates the engine's share of a served regression (bench/serving/compare_serving.py) from the
gateway's and the worker's RPC layer.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# run inside the subprocess: only APIs both checkouts have (load_model, LLMEngine, step)
CHILD = r"""
import inspect, json, sys, time
import torch
threads, out_tokens, kernels = int(sys.argv[1]), int(sys.argv[3]), sys.argv[4]
streams = [int(s) for s in sys.argv[2].split(",")]
torch.set_num_threads(threads)
from sluice.engine.config import EngineConfig
from sluice.engine.engine import LLMEngine
from sluice.models.loader import load_model
from sluice.types import GenerationRequest, SamplingParams
kw = {"progress": False}
if "kernels" in inspect.signature(load_model).parameters:
    kw["kernels"] = kernels
loaded = load_model(**kw)
engine = LLMEngine(loaded, EngineConfig())
tok = loaded.tokenizer
def prompt(i):
    msgs = [{"role": "user", "content": f"Tell me about topic number {i} and why it matters to people."}]
    if hasattr(tok, "apply_chat_template"):
        return tok.apply_chat_template(msgs, add_generation_prompt=True)
    return tok.encode(msgs[0]["content"])
out = {}
n = 0
for k in [streams[0]] + streams:  # the first pass warms up and is dropped
    engine.kv.reset_prefix_cache()
    params = SamplingParams(max_tokens=out_tokens, temperature=0.0, ignore_eos=True)
    for i in range(k):
        n += 1
        engine.add_request(GenerationRequest(f"r{n}", prompt(i), params))
    cpu0, wall0, steps, tokens = time.process_time(), time.perf_counter(), 0, 0
    while engine.has_unfinished():
        tokens += sum(len(e.token_ids) for e in engine.step())
        steps += 1
    out[str(k)] = {"cpu_ms_per_token": 1000 * (time.process_time() - cpu0) / tokens,
                   "wall_ms_per_step": 1000 * (time.perf_counter() - wall0) / steps, "tokens": tokens}
print(json.dumps(out))
"""


def measure(checkout: Path, args: argparse.Namespace) -> dict:
    env = dict(os.environ, PYTHONPATH=str(checkout / "src"), OMP_NUM_THREADS=str(args.threads))
    cmd = [
        sys.executable,
        "-c",
        CHILD,
        str(args.threads),
        ",".join(map(str, args.streams)),
        str(args.out_tokens),
        args.kernels,
    ]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{checkout}: exit {done.returncode}\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--before", type=Path, required=True, help="the other checkout (its src/ is imported)")
    p.add_argument("--after", type=Path, default=ROOT, help="default: this checkout")
    p.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    p.add_argument("--streams", type=int, nargs="+", default=[1, 8, 32], help="concurrent requests (default 1 8 32)")
    p.add_argument("--out-tokens", type=int, default=48, help="output tokens per request (default 48)")
    p.add_argument("--rounds", type=int, default=3, help="rounds, each side once per round (default 3)")
    p.add_argument(
        "--kernels", default="torch", choices=["torch", "auto"], help="the after side's compute path (default torch)"
    )
    args = p.parse_args(argv)
    runs: dict[str, list[dict]] = {"before": [], "after": []}
    for r in range(args.rounds):
        order = [("before", args.before), ("after", args.after)]
        for name, checkout in order if r % 2 == 0 else order[::-1]:
            runs[name].append(measure(checkout, args))
            print(f"round {r + 1} {name}: " + json.dumps(runs[name][-1]), file=sys.stderr, flush=True)
    print(f"{'streams':>7} {'metric':<18} {'before':>8} {'after':>8} {'after/before':>12}")
    result = {}
    for k in map(str, args.streams):
        for metric in ("cpu_ms_per_token", "wall_ms_per_step"):
            b = statistics.median(run[k][metric] for run in runs["before"])
            a = statistics.median(run[k][metric] for run in runs["after"])
            result[f"x{k}_{metric}"] = {"before": b, "after": a, "ratio": a / b}
            print(f"{k:>7} {metric:<18} {b:8.3f} {a:8.3f} {a / b:12.3f}")
    print(json.dumps({"threads": args.threads, "load": os.getloadavg(), **result}))


if __name__ == "__main__":
    main()
