"""Training throughput: `sluice train` against a plain transformers loop, and DDP / FSDP2 on
2 processes against one, all on the same model, global batch, sequence length and cores.

    PYTHONPATH=src python bench/train/train_throughput.py [--steps 12] [--warmup 3]

One run, side by side (this machine is shared and noisy: compare the ratios, not the absolute
figures). Every configuration trains the same random ~0.7 M-parameter Llama (bench/train/train_common.py)
on 8 rows × 128 tokens per step with AdamW and gradient clipping, one torch thread per process:
- plain: a hand-written loop of transformers (`model(input_ids, labels=...)`, backward, clip,
  AdamW step) — what the framework must not be slower than;
- sluice 1: the training loop of `sluice train run --nproc 1`, run in this process (what every
  torchrun rank runs; bench/train/train_common.py); plain and sluice alternate in `--rounds` rounds
  so that they share the machine's load, and each keeps its best round;
- DDP 2 / FSDP2 2: `--nproc 2` on the same global batch, a core each: scaling efficiency =
  tokens/s ÷ (2 × one process's), 1.0 ideal. On a machine whose cores are taken by other work,
  the second process gets no second core and the wall figure measures the machine; the CPU
  figure (one process's CPU seconds per step ÷ 2 × a rank's, from `cpu_time`) is the work the
  data-parallel machinery adds, whatever the load.
One thread per process: on a machine whose cores are busy with other work, two OpenMP threads
in one process stall each other at every barrier (measured here: 7× slower than two processes
of one thread at a load average of 9 on 2 cores), which would measure the machine, not sluice.
tokens/s = all tokens of the global batch / median step time after `--warmup` steps; process
start-up is not in the figures. CPU per step (process time, all threads) is printed beside: on a
loaded machine the wall time says how much CPU the process was given, the CPU time how much
work the step is.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from train_common import median, sluice_in_process, sluice_train, steady, write_data, write_model

BATCH, SEQ = 8, 128
PLAIN = "plain transformers loop, 1 process"
ONE = "sluice train, 1 process"
DDP2 = "sluice train, DDP 2 processes"
FSDP2 = "sluice train, FSDP2 2 processes"


def plain_loop(model_dir: str, steps: int, threads: int, seed: int = 0) -> tuple[list[float], list[float]]:
    """Wall and CPU seconds per step of a plain transformers training loop."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(threads)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="sdpa").train()
    optim = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.95), foreach=True)
    vocab = model.config.vocab_size
    times, cpus = [], []
    for _ in range(steps):
        t0, c0 = time.perf_counter(), time.process_time()
        ids = torch.randint(0, vocab, (BATCH, SEQ))
        loss = model(input_ids=ids, labels=ids, use_cache=False).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optim.step()
        optim.zero_grad(set_to_none=True)
        loss.item()
        times.append(time.perf_counter() - t0)
        cpus.append(time.process_time() - c0)
    return times, cpus


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    threads = 1
    common = [
        "--seq-len",
        str(SEQ),
        "--batch-size",
        str(BATCH),
        "--lr",
        "1e-3",
        "--max-steps",
        str(args.steps),
        "--threads",
        str(threads),
    ]
    per_round: dict[str, list[float]] = {PLAIN: [], ONE: []}
    mfus: list[float] = []
    results: dict[str, float] = {}
    cpu: dict[str, float] = {}  # rank 0's CPU seconds per step (metrics.jsonl's cpu_time), median
    cpu_rounds: dict[str, list[float]] = {PLAIN: [], ONE: []}
    with tempfile.TemporaryDirectory() as tmp:
        tmp_path = Path(tmp)
        model = write_model(tmp_path / "model")
        data = write_data(tmp_path / "data.jsonl")
        # one process: the plain loop and sluice's loop alternate in rounds, in this process
        for r in range(args.rounds):
            times, cpus = plain_loop(str(model), args.steps, threads)
            per_round[PLAIN].append(BATCH * SEQ / statistics.median(times[args.warmup :]))
            cpu_rounds[PLAIN].append(statistics.median(cpus[args.warmup :]))
            lines = sluice_in_process(
                "--data", str(data), "--out", str(tmp_path / f"one-{r}"), "--model", str(model), "--nproc", "1", *common
            )[args.warmup :]
            per_round[ONE].append(BATCH * SEQ / median(lines, "step_time"))
            mfus.append(median(lines, "mfu"))
            cpu_rounds[ONE].append(median(lines, "cpu_time"))
        results[PLAIN], results[ONE] = max(per_round[PLAIN]), max(per_round[ONE])
        cpu[PLAIN], cpu[ONE] = min(cpu_rounds[PLAIN]), min(cpu_rounds[ONE])
        # two processes: torchrun groups, once each
        for name, flags in [(DDP2, []), (FSDP2, ["--parallel", "fsdp"])]:
            lines = steady(
                sluice_train(
                    data,
                    tmp_path / name.split(",")[1].strip().replace(" ", "-"),
                    model,
                    *common,
                    "--nproc",
                    "2",
                    *flags,
                ),
                args.warmup,
            )
            results[name] = BATCH * SEQ / median(lines, "step_time")
            cpu[name] = median(lines, "cpu_time")
    one, plain = results[ONE], results[PLAIN]
    print(
        f"random Llama ~0.7 M parameters, {BATCH} x {SEQ} tokens per step, {args.steps} steps (median after "
        f"{args.warmup}; one process: best of {args.rounds} alternating rounds), 1 thread per process, "
        f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}\n"
    )
    print(
        "| configuration | tokens/s | vs plain loop | scaling efficiency (wall) | CPU per step per rank (ms) "
        "| scaling efficiency (CPU) |"
    )
    print("|---|---:|---:|---:|---:|---:|")
    for name, tps in results.items():
        procs = 2 if name in (DDP2, FSDP2) else 1
        eff = "–" if name == PLAIN else f"{tps / (procs * one):.2f}"
        c = f"{cpu[name] * 1e3:.0f}"
        c_eff = "–" if name == PLAIN else f"{cpu[ONE] / (procs * cpu[name]):.2f}"
        print(f"| {name} | {tps:,.0f} | {tps / plain:.2f}x | {eff} | {c} | {c_eff} |")
    rounds = "; ".join(f"{a:,.0f} vs {b:,.0f}" for a, b in zip(per_round[ONE], per_round[PLAIN]))
    cpu_r = "; ".join(f"{a * 1e3:.0f} vs {b * 1e3:.0f}" for a, b in zip(cpu_rounds[ONE], cpu_rounds[PLAIN]))
    print(f"\nrounds, sluice vs plain: tokens/s {rounds}; CPU ms per step {cpu_r}")
    print(f"sluice 1 process vs plain loop in CPU per step: {cpu[PLAIN] / cpu[ONE]:.2f}x the throughput")
    print(f"sluice 1 process MFU (against the measured matmul peak): {statistics.median(mfus):.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
