"""Checkpoint overhead: how much an asynchronous DCP checkpoint every N steps slows training,
against none and against a synchronous one.

    PYTHONPATH=src python bench/train/train_checkpoint.py [--steps 12] [--every 3] [--rounds 3]

The training loop of `sluice train run` (one rank, one thread, in this process: see
bench/train/train_common.py) on the same model, data and batch, three configurations alternating in
`--rounds` rounds so that they share the machine's load: no checkpoint until the end,
`--checkpoint-every N` asynchronous (the default), and the same with `--sync-checkpoint`.
- held: the seconds the steps were held by checkpoints (`checkpoint_time` in metrics.jsonl:
  the state's copy to CPU memory and any wait for the previous write), over the steps' time;
- CPU: the CPU seconds checkpoints cost (the process's CPU time against the run without
  checkpoints; a run of 2 steps gives the start-up's share), per step, over a step's CPU time:
  the cost when no core is free for the background writer, as on this shared machine;
- wall: the mean step time against the run without checkpoints, the median of the rounds
  (includes the machine's noise: other processes share the cores).
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
from train_common import sluice_in_process, write_data, write_model


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--every", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    configs = [
        ("none", []),
        ("async", ["--checkpoint-every", str(args.every)]),
        ("sync", ["--checkpoint-every", str(args.every), "--sync-checkpoint"]),
    ]
    means: dict[str, list[float]] = {name: [] for name, _ in configs}
    held: dict[str, list[float]] = {name: [] for name, _ in configs}
    cpu: dict[str, list[float]] = {name: [] for name, _ in [*configs, ("start", [])]}
    with tempfile.TemporaryDirectory() as tmp:
        tmp_path = Path(tmp)
        model = write_model(tmp_path / "model")
        data = write_data(tmp_path / "data.jsonl")

        def run(out: str, steps: int, flags: list[str], into: list[float]) -> list[dict]:
            return sluice_in_process(
                "--data",
                str(data),
                "--out",
                str(tmp_path / out),
                "--model",
                str(model),
                "--nproc",
                "1",
                "--threads",
                "1",
                "--seq-len",
                "128",
                "--batch-size",
                "8",
                "--lr",
                "1e-3",
                "--max-steps",
                str(steps),
                *flags,
                cpu=into,
            )

        for r in range(args.rounds):
            run(f"start-{r}", 2, [], cpu["start"])
            for name, flags in configs:
                lines = run(f"{name}-{r}", args.steps, flags, cpu[name])[args.warmup : -1]
                means[name].append(statistics.mean(x["step_time"] for x in lines))
                held[name].append(sum(x["checkpoint_time"] for x in lines) / sum(x["step_time"] for x in lines))
        state_mb = sum(p.stat().st_size for p in (tmp_path / "sync-0" / "checkpoints").rglob("*") if p.is_file()) / 1e6
    med = {k: statistics.median(v) for k, v in cpu.items()}
    step_cpu = (med["none"] - med["start"]) / (args.steps - 2)  # CPU seconds of one step without checkpoints
    print(
        f"random Llama ~0.7 M parameters (a checkpoint: {state_mb:.1f} MB, weights + AdamW state), 8 x 128 tokens "
        f"per step, a checkpoint every {args.every} steps, {args.steps} steps x {args.rounds} rounds (medians), "
        f"1 thread, load average {os.getloadavg()[0]:.1f}\n"
    )
    print("| checkpoints | held (share of step time) | CPU overhead per step | wall: mean step (ms) | wall overhead |")
    print("|---|---:|---:|---:|---:|")
    base = statistics.median(means["none"])
    for name, _ in configs:
        extra = (med[name] - med["none"]) / args.steps / step_cpu
        wall = statistics.median(means[name])
        held_share = statistics.median(held[name])
        print(f"| {name} | {held_share:.1%} | {extra:+.1%} | {wall * 1e3:.0f} | {wall / base - 1:+.1%} |")
    print(f"\none step without checkpoints: {step_cpu * 1e3:.0f} ms of CPU")
    return 0


if __name__ == "__main__":
    sys.exit(main())
