"""Activation checkpointing: the memory it saves and the time it costs, side by side in one run.

    PYTHONPATH=src python bench/train/activation_checkpointing.py [--steps 4] [--seq-len 1024] [--batch-size 8]

Trains the same random Llama (bench/train/train_common.py's byte-level tokenizer, 8 layers x 256 wide,
so the activations of a long row dominate the memory, not the weights and AdamW's state) with
`sluice train run --nproc 1`, without and then with `--activation-checkpointing`, each in a fresh
wrapper process whose reaped descendants' peak RSS (getrusage, RUSAGE_CHILDREN) is the worker's
peak. The two settings alternate (off, on, off, on) and the step time is the fastest step after
the first of each setting's runs: on a shared machine another process's burst only makes steps
slower, never faster. One torch thread, so the CPU seconds a step used (metrics.jsonl's cpu_time)
are its compute, which another process's load changes far less than the wall time. Prints a
Markdown table: peak RSS, step time, CPU time, loss (equal: recomputation changes no arithmetic).
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from train_common import write_model

SHAPE = dict(
    hidden_size=256,
    intermediate_size=688,
    num_hidden_layers=8,
    num_attention_heads=8,
    num_key_value_heads=4,
    max_position_embeddings=4096,
)


def make_data(path: Path) -> None:
    with path.open("w") as f:
        for i in range(400):
            f.write(json.dumps({"text": f"Document {i}: " + " ".join(str(i * j % 997) for j in range(120))}) + "\n")


def one(argv: list[str]) -> int:
    """The wrapper: run one training, print the peak RSS of its process tree's largest member."""
    subprocess.run(argv, check=True, capture_output=True)
    print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)  # KiB on Linux
    return 0


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--one":
        return one(sys.argv[2:])
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--seq-len", default="1024")
    ap.add_argument("--batch-size", default="8")
    args = ap.parse_args()
    results: dict[bool, list[tuple[float, list[tuple[float, float]], float]]] = {False: [], True: []}
    with tempfile.TemporaryDirectory() as tmp:
        model = write_model(Path(tmp) / "model", SHAPE)
        data = Path(tmp) / "data.jsonl"
        make_data(data)
        for i, ckpt in enumerate((False, True, False, True)):
            out = Path(tmp) / f"ac{i}"
            cmd = [
                sys.executable,
                "-m",
                "sluice.cli",
                "train",
                "run",
                "--data",
                str(data),
                "--out",
                str(out),
                "--model",
                str(model),
                "--nproc",
                "1",
                "--max-steps",
                str(args.steps),
                "--seq-len",
                args.seq_len,
                "--batch-size",
                args.batch_size,
                "--lr",
                "1e-3",
                "--threads",
                "1",
                *(["--activation-checkpointing"] if ckpt else []),
            ]
            peak = subprocess.run(
                [sys.executable, __file__, "--one", *cmd], check=True, capture_output=True, text=True
            ).stdout.split()[-1]
            m = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
            results[ckpt].append((int(peak) / 1024, [(x["step_time"], x["cpu_time"]) for x in m[1:]], m[-1]["loss"]))
    rows = [
        (
            ckpt,
            max(r[0] for r in runs),
            min(t for r in runs for t, _ in r[1]),
            min(c for r in runs for _, c in r[1]),
            runs[-1][2],
        )
        for ckpt, runs in results.items()
    ]
    (_, base_mem, base_time, base_cpu, _), (_, mem, t, cpu, _) = rows
    print(
        f"random Llama {SHAPE['num_hidden_layers']} layers x {SHAPE['hidden_size']}, one process, fp32 CPU, "
        f"batch {args.batch_size} x {args.seq_len} tokens, {args.steps} steps\n"
    )
    print("| activation checkpointing | peak RSS (MiB) | step time (s, fastest) | CPU s per step (least) | last loss |")
    print("|---|---:|---:|---:|---:|")
    for ckpt, peak_mib, step, step_cpu, loss in rows:
        print(f"| {'on' if ckpt else 'off'} | {peak_mib:,.0f} | {step:.2f} | {step_cpu:.2f} | {loss:.4f} |")
    print(
        f"\nsaved {base_mem - mem:,.0f} MiB ({(base_mem - mem) / base_mem:.0%} of the peak); "
        f"step time x{t / base_time:.2f}, CPU time x{cpu / base_cpu:.2f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
