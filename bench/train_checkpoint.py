"""Checkpoint overhead: how much an asynchronous DCP checkpoint every N steps slows training,
against none and against a synchronous one.

    PYTHONPATH=src python bench/train_checkpoint.py [--steps 12] [--every 3] [--rounds 3]

The training loop of `sluice train run` (one rank, one thread, in this process: see
bench/train_common.py) on the same model, data and batch, three configurations alternating in
`--rounds` rounds so that they share the machine's load: no checkpoint until the end,
`--checkpoint-every N` asynchronous (the default), and the same with `--sync-checkpoint`.
- held: the seconds the steps were held by checkpoints (`checkpoint_time` in metrics.jsonl:
  the state's copy to CPU memory and any wait for the previous write), over the steps' time;
- overhead: the mean step time against the run without checkpoints (this includes the
  background write competing with training for the core), the best round of each.
The final step's checkpoint is synchronous in every run (a finished run is saved) and is left
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
from train_common import sluice_in_process, write_data, write_model  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--every", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    configs = [("none", []), ("async", ["--checkpoint-every", str(args.every)]),
               ("sync", ["--checkpoint-every", str(args.every), "--sync-checkpoint"])]
    means: dict[str, list[float]] = {name: [] for name, _ in configs}
    held: dict[str, list[float]] = {name: [] for name, _ in configs}
    with tempfile.TemporaryDirectory() as tmp:
        tmp_path = Path(tmp)
        model = write_model(tmp_path / "model")
        data = write_data(tmp_path / "data.jsonl")
        for r in range(args.rounds):
            for name, flags in configs:
                out = tmp_path / f"{name}-{r}"
                lines = sluice_in_process("--data", str(data), "--out", str(out), "--model", str(model), "--nproc", "1",
                                          "--threads", "1", "--seq-len", "128", "--batch-size", "8", "--lr", "1e-3",
                                          "--max-steps", str(args.steps), *flags)[args.warmup:-1]
                means[name].append(statistics.mean(x["step_time"] for x in lines))
                held[name].append(sum(x["checkpoint_time"] for x in lines) / sum(x["step_time"] for x in lines))
        state_mb = sum(p.stat().st_size for p in (tmp_path / "sync-0" / "checkpoints").rglob("*") if p.is_file()) / 1e6
    base = min(means["none"])
    print(f"random Llama ~0.7 M parameters (a checkpoint: {state_mb:.1f} MB, weights + AdamW state), 8 x 128 tokens "
          f"per step, a checkpoint every {args.every} steps, {args.steps} steps x {args.rounds} rounds, 1 thread, "
          f"load average {os.getloadavg()[0]:.1f}\n")
    print("| checkpoints | mean step, best round (ms) | every round (ms) | held (share of step time) | overhead vs none |")
    print("|---|---:|---:|---:|---:|")
    for name, _ in configs:
        best = min(means[name])
        rounds = ", ".join(f"{m * 1e3:.0f}" for m in means[name])
        print(f"| {name} | {best * 1e3:.1f} | {rounds} | {statistics.median(held[name]):.1%} | {best / base - 1:+.1%} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
