#!/usr/bin/env python3
"""LoRA's cost on the CPU kernels, in one process (docs/BENCHMARKS.md, "LoRA"):

- a decode step of K rows (default 32) with 8 distinct rank-16 adapters on every linear (K/8 rows
  each) against the same step on the base model alone: one engine (bundled model, default
  EngineConfig, --threads torch threads: the helper pool splits as a served worker's does), its
  K requests alternating step by step between the two (their adapters set or cleared before each
  step), the lead swapping every step so that a burst of other work lands on both alike. The
  figure: the median over paired steps of lora / base wall time;
- loading one rank-16 adapter of the bundled model (read and check the folder, lay it out for the
  fused linears, bind it for the kernels): the median of --loads cold loads (a fresh cache each
  time; the file itself in the page cache, as on a worker that read it before);
- the memory of one resident adapter (its fp32 weights as laid out).

The last stdout line is one JSON object.

    PYTHONPATH=src .venv/bin/python bench/kernels/lora_step.py --rows 32 --steps 40
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.common import log, write_lora_adapter
from bench.kernels.paired_steps import medians, paired_decode_steps


def load_times(engine, ref, loads: int) -> list[float]:
    from sluice.engine.adapters import AdapterCache

    times = []
    for _ in range(loads):
        cache = AdapterCache(engine.model, 4, 64)
        t0 = time.perf_counter()
        cache.get(ref)
        times.append(1000 * (time.perf_counter() - t0))
    return times


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=2, help="torch threads (default 2)")
    p.add_argument("--rows", type=int, default=32, help="decode rows per step (default 32)")
    p.add_argument("--adapters", type=int, default=8, help="distinct adapters in the step (default 8)")
    p.add_argument("--rank", type=int, default=16)
    p.add_argument("--steps", type=int, default=40, help="paired decode steps (default 40)")
    p.add_argument("--loads", type=int, default=10, help="adapter loads timed (default 10)")
    args = p.parse_args(argv)

    import torch

    torch.set_num_threads(args.threads)
    from sluice.engine.config import EngineConfig
    from sluice.engine.engine import LLMEngine
    from sluice.models.loader import load_model
    from sluice.types import AdapterRef

    loaded = load_model(progress=False)
    engine = LLMEngine(
        loaded, EngineConfig(speculative_tokens=0, max_loras=args.adapters, max_cpu_loras=max(16, args.adapters))
    )
    root = Path(tempfile.mkdtemp(prefix="sluice-lora-bench-"))
    refs = [
        AdapterRef(f"a{i}", str(write_lora_adapter(root / f"a{i}", loaded.config, args.rank, seed=i)))
        for i in range(args.adapters)
    ]
    for ref in refs:
        engine.adapters.prefetch(ref)
    log(f"{args.adapters} adapters of rank {args.rank} resident")

    def set_adapters(on: bool) -> None:
        for i, request in enumerate(engine.scheduler.running):
            request.adapter = refs[i % len(refs)] if on else None

    sides = {"lora": lambda: set_adapters(True), "base": lambda: set_adapters(False)}
    times = paired_decode_steps(engine, loaded.tokenizer, args.rows, args.steps, sides)
    med = medians(times, "lora", "base")
    loads = load_times(engine, refs[0], args.loads)
    per_adapter = engine.adapters.get(refs[0]).nbytes
    result = {
        "threads": args.threads,
        "rows": args.rows,
        "adapters": args.adapters,
        "rank": args.rank,
        "step": med,
        "load_ms_median": statistics.median(loads),
        "load_ms_all": loads,
        "adapter_bytes": per_adapter,
        "adapter_file_bytes": (Path(refs[0].source) / "adapter_model.safetensors").stat().st_size,
        "isa": getattr(loaded.model.ops, "isa", lambda: "torch")(),
        "load": os.getloadavg(),
    }
    print(
        f"{args.rows}-row decode step: base {med['base_wall_ms']:.2f} ms, {args.adapters} adapters "
        f"{med['lora_wall_ms']:.2f} ms, lora/base (paired) {med['ratio_wall']:.3f}"
    )
    print(
        f"adapter load: median {result['load_ms_median']:.1f} ms; memory per resident adapter "
        f"{per_adapter / 2**20:.1f} MiB"
    )
    print(json.dumps(result))


if __name__ == "__main__":
    main()
