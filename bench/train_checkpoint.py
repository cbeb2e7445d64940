"""Checkpoint overhead: how much an asynchronous DCP checkpoint every N steps slows training,
against none and against a synchronous one.

    PYTHONPATH=src python bench/train_checkpoint.py [--steps 16] [--every 2]

`sluice train run --nproc 1` three times on the same model, data and batch (bench/train_common.py,
one thread): no checkpoint until the end, `--checkpoint-every N` asynchronous (the default), and
the same with `--sync-checkpoint`. Two figures per run:
- held: the seconds the steps were held by checkpoints (the `checkpoint_time` of metrics.jsonl:
  the state's copy to CPU memory and any wait for the previous write), over the steps' time;
- slowdown: the mean step time against the run without checkpoints (includes the background
  write competing with training for the cores; noisy across runs on a shared machine).
The last step's checkpoint is synchronous in every run (a finished run is saved) and is left
out, as are the first `--warmup` steps.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from train_common import sluice_train, write_data, write_model  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--every", type=int, default=2)
    ap.add_argument("--warmup", type=int, default=2)
    args = ap.parse_args()
    common = ["--nproc", "1", "--threads", "1", "--seq-len", "128", "--batch-size", "8", "--lr", "1e-3",
              "--max-steps", str(args.steps)]
    runs = [("none", []), ("async", ["--checkpoint-every", str(args.every)]),
            ("sync", ["--checkpoint-every", str(args.every), "--sync-checkpoint"])]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp_path = Path(tmp)
        model = write_model(tmp_path / "model")
        data = write_data(tmp_path / "data.jsonl")
        for name, flags in runs:
            lines = sluice_train(data, tmp_path / name, model, *common, *flags)[args.warmup:-1]
            rows.append((name, statistics.mean(x["step_time"] for x in lines),
                         sum(x["checkpoint_time"] for x in lines) / sum(x["step_time"] for x in lines),
                         sum(x["checkpoint_time"] > 0 for x in lines)))
        state_mb = sum(p.stat().st_size for p in (tmp_path / "sync" / "checkpoints").rglob("*") if p.is_file()) / 1e6
    base = rows[0][1]
    print(f"random Llama ~0.7 M parameters (checkpoint {state_mb:.1f} MB: weights + AdamW state), 8 x 128 tokens "
          f"per step, checkpoint every {args.every} steps, {args.steps} steps, 1 thread, "
          f"load average {os.getloadavg()[0]:.1f}\n")
    print("| checkpoints | mean step (ms) | held (share of step time) | slowdown vs none | checkpoints |")
    print("|---|---:|---:|---:|---:|")
    for name, mean, held, count in rows:
        print(f"| {name} | {mean * 1e3:.1f} | {held:.1%} | {mean / base - 1:+.1%} | {count} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
