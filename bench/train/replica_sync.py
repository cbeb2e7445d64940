"""Less communication across replica groups: bytes per step and loss after N steps, DDP against
torchft replica groups that exchange every step's gradients, and torchft's LocalSGD and DiLoCo.

    PYTHONPATH=src python bench/train/replica_sync.py [--steps 40] [--sync-every 8] [--model random:tiny]

Runs `sluice train run` once per variant, same data, model, seed and global batch, one after
another on this machine, 2 processes each: plain DDP over 2 ranks, and 2 replica groups of 1 rank
(`--replica-groups 2`) with `--replica-sync step | local_sgd | diloco`. Bytes are what a rank hands
to collectives per step (DDP's buckets; across groups, every step's gradients plus the
8-byte-per-group step vector, or LocalSGD / DiLoCo's parameters or their change at a sync step and
nothing between syncs), averaged over all steps; the loss is the mean over the last 5 steps (the
global batch's, except LocalSGD / DiLoCo's: group 0's own half of it, the groups present being
known only at a sync). Prints a Markdown table (docs/BENCHMARKS.md).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

from train_common import two_rank_run, write_sums_chat


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--sync-every", type=int, default=8)
    ap.add_argument("--model", default="random:tiny")
    ap.add_argument("--seq-len", default="128")
    args = ap.parse_args()
    variants = [
        ("DDP, 2 ranks", []),
        ("replica groups, gradients every step", ["--replica-groups", "2"]),
        (
            f"LocalSGD, parameters every {args.sync_every} steps",
            ["--replica-groups", "2", "--replica-sync", "local_sgd", "--sync-every", str(args.sync_every)],
        ),
        (
            f"DiLoCo, every {args.sync_every} steps",
            ["--replica-groups", "2", "--replica-sync", "diloco", "--sync-every", str(args.sync_every)],
        ),
    ]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "data.jsonl"
        write_sums_chat(data)
        for i, (name, extra) in enumerate(variants):
            out = Path(tmp) / f"v{i}"
            m = two_rank_run(data, out, args.model, args.steps, args.seq_len, *extra)
            rows.append(
                (
                    name,
                    statistics.mean(x["comm_bytes"] for x in m),
                    statistics.median(x["step_time"] for x in m),
                    statistics.mean(x["loss"] for x in m[-5:]),
                )
            )
    base_bytes, _, base_loss = rows[0][1:]
    print(f"{args.model}, 2 processes (gloo), {args.steps} steps, global batch 8 x {args.seq_len} tokens\n")
    print("| exchange | bytes/step/rank | vs DDP | step time (ms, median) | loss (last 5) | vs DDP |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, b, t, loss in rows:
        print(f"| {name} | {b:,.0f} | {b / base_bytes:.3f}x | {t * 1e3:.1f} | {loss:.4f} | {loss - base_loss:+.4f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
