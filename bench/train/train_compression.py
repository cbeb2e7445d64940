"""Gradient compression on one fixed run: bytes per step, step time and loss against uncompressed.

    PYTHONPATH=src python bench/train/train_compression.py [--steps 20] [--model random:tiny]

Runs `sluice train run` (2 ranks, DDP) once per hook, same data, model, seed and batch, one after
another on this machine, and prints a Markdown table (docs/BENCHMARKS.md holds the figures).
Bytes are what each rank hands to the collective per step; step time is the median; the loss is
the mean of the last 5 steps (compression changes the trajectory, this shows by how much).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

from train_common import two_rank_run, write_sums_chat

HOOKS = ["none", "fp16", "bf16", "powersgd", "topk"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--model", default="random:tiny")
    ap.add_argument("--seq-len", default="128")
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "data.jsonl"
        write_sums_chat(data)
        for hook in HOOKS:
            out = Path(tmp) / hook
            m = two_rank_run(data, out, args.model, args.steps, args.seq_len, "--compression", hook)
            steady = m[2:] or m  # PowerSGD sends everything for its first two steps
            rows.append(
                (
                    hook,
                    statistics.median(x["comm_bytes"] for x in steady),
                    statistics.median(x["step_time"] for x in steady),
                    statistics.median(x["comm_time"] for x in steady),
                    statistics.mean(x["loss"] for x in m[-5:]),
                )
            )
    base_bytes, base_time, _, base_loss = rows[0][1:]
    print(f"{args.model}, 2 ranks DDP (gloo), {args.steps} steps, batch 8 x {args.seq_len} tokens\n")
    print("| hook | bytes/step/rank | vs none | step time (ms) | comm time (ms) | loss (last 5) | vs none |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for hook, b, t, c, loss in rows:
        print(
            f"| {hook} | {b:,.0f} | {b / base_bytes:.3f}x | {t * 1e3:.1f} | {c * 1e3:.1f} | {loss:.4f} | "
            f"{loss - base_loss:+.4f} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
