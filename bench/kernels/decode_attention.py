#!/usr/bin/env python3
"""Decode attention at short and long context, before vs after a change, side by side in one run.

Two measures per side, each in a fresh process of that side's checkout (`--before DIR`: another
checkout of the repository, e.g. a `git worktree`; the after side is this one), the sides
alternating round by round so a burst of other work on the shared machine lands on both alike:

* `kernel`: the paged decode attention alone (`KernelPagedAttention.attend`), one sequence of
  --contexts tokens over scattered blocks, the bundled model's shape (9 query heads, 3 KV heads,
  head dim 64, block 8), once per layer over 30 layers' own caches as in a forward, so that at
  long context K/V come from memory as they do in a decode step, not from a hot cache. Reported
  per forward (30 calls): wall ms and the process's CPU ms (every thread's, helpers included).
* `engine`: a real decode step of the bundled model (exact numerics, the default fp32 K/V cache),
  one request whose prompt has --contexts tokens; the median step's wall and process CPU time.

Each at every --threads count (torch threads; default 1, where the CPU time is the work
regardless of the machine's load). bench/kernels/batch1_cores.py measures the helper pool's split.

The ratios after / before over the rounds' medians are the figures to quote.

    git worktree add /tmp/sluice-before <commit>
    PYTHONPATH=src .venv/bin/python bench/kernels/decode_attention.py --before /tmp/sluice-before [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

SENTENCE = (
    "The keeper climbed the steps each evening, trimmed the wick, wound the clockwork and wrote the weather "
    "in a leather book while ships passed in the night. "
)
LAYERS, HEADS, KV_HEADS, HEAD_DIM, BLOCK = 30, 9, 3, 64, 8


def _clocks() -> tuple[float, float]:
    return time.perf_counter(), time.process_time()


def _kernel_figures(contexts: list[int], reps: int, kv_dtype: str, tag: str) -> dict[str, float]:
    import torch

    from sluice.models.attention import AttentionMetadata
    from sluice.models.kernels import kernel_ops
    from sluice.models.kernels.paged_attention import KernelPagedAttention

    ops = kernel_ops()
    if ops is None:
        raise SystemExit("the CPU kernels are unavailable here")
    dtype = torch.float16 if kv_dtype == "float16" else torch.float32
    out: dict[str, float] = {}
    g = torch.Generator().manual_seed(0)
    kernel = KernelPagedAttention(ops, HEADS, KV_HEADS, HEAD_DIM, None)
    for ctx in contexts:
        nb = -(-ctx // BLOCK)
        pool = 4 * nb + 1  # the sequence's blocks scattered over a larger pool, as in a real cache
        caches = [
            (
                torch.randn(KV_HEADS, pool * BLOCK, HEAD_DIM, generator=g).to(dtype),
                torch.randn(KV_HEADS, pool * BLOCK, HEAD_DIM, generator=g).to(dtype),
            )
            for _ in range(LAYERS)
        ]
        table = (torch.randperm(pool - 1, generator=g)[:nb] + 1).to(torch.int32)
        meta = AttentionMetadata(
            slot_mapping=torch.empty(0, dtype=torch.long),
            num_decodes=1,
            block_size=BLOCK,
            block_tables=table.view(1, -1).contiguous(),
            context_lens=torch.tensor([ctx], dtype=torch.int32),
        )
        kernel.prepare(meta)
        q = torch.randn(1, (HEADS + 2 * KV_HEADS) * HEAD_DIM, generator=g)
        wall, cpu = [], []
        for _ in range(reps):
            w0, c0 = _clocks()
            for k, v in caches:
                kernel.attend(q, k, v, meta)
            w1, c1 = _clocks()
            wall.append(w1 - w0)
            cpu.append(c1 - c0)
        out[f"kernel_{ctx}_{tag}_wall_ms"] = statistics.median(wall) * 1e3
        out[f"kernel_{ctx}_{tag}_cpu_ms"] = statistics.median(cpu) * 1e3
    return out


def _engine():
    from sluice.engine.config import EngineConfig
    from sluice.engine.engine import LLMEngine
    from sluice.models.loader import load_model

    loaded = load_model(progress=False)
    return LLMEngine(loaded, EngineConfig(speculative_tokens=0)), loaded.tokenizer.encode(SENTENCE * 200)


def _engine_figures(engine, text: list[int], contexts: list[int], steps: int, tag: str) -> dict[str, float]:
    from sluice.types import GenerationRequest, SamplingParams

    out: dict[str, float] = {}
    for ctx in contexts:
        rid = f"c{ctx}"
        engine.kv.reset_prefix_cache()
        engine.add_request(
            GenerationRequest(rid, text[:ctx], SamplingParams(max_tokens=steps + 4, temperature=0.0, ignore_eos=True))
        )
        while engine.stats().num_running == 0 or engine.requests[rid].num_output_tokens < 2:
            engine.step()  # the prefill and a first decode, not timed
        wall, cpu = [], []
        for _ in range(steps):
            w0, c0 = _clocks()
            engine.step()
            w1, c1 = _clocks()
            wall.append(w1 - w0)
            cpu.append(c1 - c0)
        engine.abort_request(rid)
        while engine.has_unfinished():
            engine.step()
        out[f"engine_{ctx}_{tag}_wall_ms"] = statistics.median(wall) * 1e3
        out[f"engine_{ctx}_{tag}_cpu_ms"] = statistics.median(cpu) * 1e3
    return out


def measure(args: argparse.Namespace) -> None:
    import torch

    contexts = [int(c) for c in args.contexts.split(",")]
    engine = None if args.kernel_only else _engine()
    fig: dict[str, float] = {}
    for threads in (int(t) for t in args.threads.split(",")):
        torch.set_num_threads(threads)
        fig.update(_kernel_figures(contexts, args.reps, args.kv_cache_dtype, f"t{threads}"))
        if engine is not None:
            fig.update(_engine_figures(engine[0], engine[1], contexts, args.steps, f"t{threads}"))
    print(json.dumps(fig))


def drive(args: argparse.Namespace) -> None:
    here = Path(__file__).resolve().parents[2]
    sides = {"before": args.before.resolve(), "after": here}
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--measure",
        "--contexts",
        args.contexts,
        "--reps",
        str(args.reps),
        "--steps",
        str(args.steps),
        "--threads",
        args.threads,
        "--kv-cache-dtype",
        args.kv_cache_dtype,
    ]
    if args.kernel_only:
        cmd.append("--kernel-only")
    figures: dict[str, list[dict[str, float]]] = {"before": [], "after": []}
    for r in range(args.rounds):
        for side in ["before", "after"] if r % 2 == 0 else ["after", "before"]:
            env = dict(os.environ, PYTHONPATH=str(sides[side] / "src"))
            res = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=sides[side], timeout=600)
            if res.returncode != 0:
                raise SystemExit(f"{side} failed:\n{res.stderr[-3000:]}")
            figures[side].append(json.loads(res.stdout.strip().splitlines()[-1]))
            print(f"round {r} {side}: {figures[side][-1]}  load {os.getloadavg()[0]:.2f}", file=sys.stderr)
    result: dict[str, dict[str, float]] = {}
    print(f"\n{'figure':>26} {'before':>9} {'after':>9} {'after/before':>13} {'paired':>7}", file=sys.stderr)
    for key in figures["after"][0]:
        b = statistics.median(f[key] for f in figures["before"])
        a = statistics.median(f[key] for f in figures["after"])
        paired = statistics.median(fa[key] / fb[key] for fa, fb in zip(figures["after"], figures["before"]))
        result[key] = {"before": b, "after": a, "ratio": a / b, "paired_ratio": paired}
        print(f"{key:>26} {b:9.2f} {a:9.2f} {a / b:13.3f} {paired:7.3f}", file=sys.stderr)
    result["load_average"] = dict(zip(("1m", "5m", "15m"), os.getloadavg()))
    print(json.dumps(result))


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--before", type=Path, help="a checkout of the commit to compare against")
    p.add_argument("--contexts", default="70,1368", help="context lengths in tokens (default: 70,1368)")
    p.add_argument("--rounds", type=int, default=3, help="rounds, the lead alternating (default: 3)")
    p.add_argument("--reps", type=int, default=40, help="kernel: forwards' worth of calls per context (default: 40)")
    p.add_argument("--steps", type=int, default=24, help="engine: decode steps per context (default: 24)")
    p.add_argument("--kv-cache-dtype", default="auto", choices=("auto", "float16"), help="kernel: the cache's dtype")
    p.add_argument("--threads", default="1", help="torch threads to measure at, comma-separated (default: 1)")
    p.add_argument("--kernel-only", action="store_true", help="skip the engine decode steps")
    p.add_argument("--measure", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.measure:
        measure(args)
    elif args.before is None:
        p.error("--before DIR is required (or --measure for one side alone)")
    else:
        drive(args)


if __name__ == "__main__":
    main()
